//! The SeaORM adapter of `grpc_core_api::GrpcOperationLedger`: the ledger table's migrations, in a
//! migrator of its own, and `SeaOrmOperationLedger`, which runs on the connection or transaction
//! its caller gives it, on PostgreSQL or SQLite.
//!
//! Filled by the SeaORM adapter issue.
