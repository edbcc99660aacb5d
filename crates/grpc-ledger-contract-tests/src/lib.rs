//! The contract suite that every `grpc_core_api::GrpcOperationLedger` adapter must pass, and the
//! in-memory double that passes it honestly.
//!
//! Filled by the contract-suite issue.
