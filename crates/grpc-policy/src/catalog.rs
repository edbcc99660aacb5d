//! The methods a service really has, and how safe each is to repeat.

use std::collections::{BTreeMap, BTreeSet};

use grpc_core_api::GrpcMethod;
use prost::Message;
use prost_types::FileDescriptorSet;
use prost_types::method_options::IdempotencyLevel;

/// How safe a method is to send again after it may have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MethodClass {
    /// Reads (`idempotency_level = NO_SIDE_EFFECTS`).
    NoSideEffects,
    /// Repeating it leaves the same state (`idempotency_level = IDEMPOTENT`).
    Idempotent,
    /// A mutation made idempotent by a caller key and the server's durable ledger; marked
    /// explicitly, since protobuf has no option for it.
    KeyedMutation,
    /// Anything else: never repeated once sent.
    NonIdempotent,
}

/// One method of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodInfo {
    /// Its full name.
    pub method: GrpcMethod,
    /// Its class.
    pub class: MethodClass,
    /// Whether the class was declared (an `idempotency_level` other than the default, or a mark
    /// in code), rather than assumed: an undeclared method is treated as non-idempotent, but a
    /// retry covering it is more likely a missing declaration than a bug.
    pub declared: bool,
    /// Whether the client streams requests.
    pub client_streaming: bool,
    /// Whether the server streams responses.
    pub server_streaming: bool,
}

/// Why a catalog could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The bytes are not a protobuf `FileDescriptorSet`.
    #[error("not a protobuf FileDescriptorSet: {0}")]
    NotADescriptorSet(String),
    /// A service or method name in the descriptor set is not valid.
    #[error("invalid method name in the descriptor set: {0}")]
    InvalidName(String),
    /// A mark names a method the catalog does not have.
    #[error("cannot mark {0}: no such method in the catalog")]
    UnknownMethod(String),
}

/// The methods of one or more services, by full name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MethodCatalog {
    methods: BTreeMap<GrpcMethod, MethodInfo>,
    /// Every service the descriptor set declares, those without methods too.
    services: BTreeSet<String>,
}

impl MethodCatalog {
    /// An empty catalog, to declare methods in code.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the serialized `FileDescriptorSet` that `protoc --descriptor_set_out` or protox
    /// writes.
    /// Methods with the option `(grpc_safe_retries.v1.keyed_mutation) = true`
    /// ([`KEYED_MUTATION_OPTION_PROTO`]) are keyed mutations, declared so.
    pub fn from_descriptor_set_bytes(bytes: &[u8]) -> Result<Self, CatalogError> {
        let set = FileDescriptorSet::decode(bytes)
            .map_err(|e| CatalogError::NotADescriptorSet(e.to_string()))?;
        let mut catalog = Self::from_descriptor_set(&set)?;
        for method in keyed_option::methods_marked(bytes)? {
            catalog.mark_keyed_mutation(&method)?;
        }
        Ok(catalog)
    }

    /// Every method of every service in the set, classed by its `idempotency_level` option.
    pub fn from_descriptor_set(set: &FileDescriptorSet) -> Result<Self, CatalogError> {
        let mut catalog = Self::new();
        for file in &set.file {
            for service in &file.service {
                let service_name = match file.package() {
                    "" => service.name().to_owned(),
                    package => format!("{package}.{}", service.name()),
                };
                catalog.services.insert(service_name.clone());
                for method in &service.method {
                    let full =
                        GrpcMethod::from_parts(&service_name, method.name()).map_err(|_| {
                            CatalogError::InvalidName(format!("{service_name}/{}", method.name()))
                        })?;
                    let level = method
                        .options
                        .as_ref()
                        .map_or(IdempotencyLevel::IdempotencyUnknown, |o| {
                            o.idempotency_level()
                        });
                    let (class, declared) = match level {
                        IdempotencyLevel::NoSideEffects => (MethodClass::NoSideEffects, true),
                        IdempotencyLevel::Idempotent => (MethodClass::Idempotent, true),
                        IdempotencyLevel::IdempotencyUnknown => (MethodClass::NonIdempotent, false),
                    };
                    catalog.declare(MethodInfo {
                        method: full,
                        class,
                        declared,
                        client_streaming: method.client_streaming(),
                        server_streaming: method.server_streaming(),
                    });
                }
            }
        }
        Ok(catalog)
    }

    /// Adds (or replaces) a method.
    pub fn declare(&mut self, info: MethodInfo) {
        self.services.insert(info.method.service().to_owned());
        self.methods.insert(info.method.clone(), info);
    }

    /// Marks a method the catalog has as a keyed mutation.
    pub fn mark_keyed_mutation(&mut self, method: &GrpcMethod) -> Result<(), CatalogError> {
        self.mark(method, MethodClass::KeyedMutation)
    }

    /// Marks a method the catalog has as non-idempotent, declared so: a retry covering it is an
    /// error, not a missing declaration.
    pub fn mark_non_idempotent(&mut self, method: &GrpcMethod) -> Result<(), CatalogError> {
        self.mark(method, MethodClass::NonIdempotent)
    }

    fn mark(&mut self, method: &GrpcMethod, class: MethodClass) -> Result<(), CatalogError> {
        match self.methods.get_mut(method) {
            Some(info) => {
                info.class = class;
                info.declared = true;
                Ok(())
            }
            None => Err(CatalogError::UnknownMethod(method.to_string())),
        }
    }

    /// Whether the descriptor set declares `service`, with or without methods.
    pub fn declares_service(&self, service: &str) -> bool {
        self.services.contains(service)
    }

    /// A method by full name.
    pub fn get(&self, method: &GrpcMethod) -> Option<&MethodInfo> {
        self.methods.get(method)
    }

    /// Whether the catalog has any method of `service`.
    pub fn has_service(&self, service: &str) -> bool {
        self.methods.keys().any(|m| m.service() == service)
    }

    /// Every method, ordered by full name.
    pub fn methods(&self) -> impl Iterator<Item = &MethodInfo> {
        self.methods.values()
    }
}

/// The `.proto` that defines the method option `(grpc_safe_retries.v1.keyed_mutation)`: write it
/// where your `protoc`/protox include path finds `grpc_safe_retries/v1/options.proto`, import it,
/// and set the option on each keyed mutation. The catalog, the RetryLayer built from it and the
/// lint then know the method's class from the descriptor set alone.
pub const KEYED_MUTATION_OPTION_PROTO: &str =
    include_str!("../proto/grpc_safe_retries/v1/options.proto");

/// The field number of `(grpc_safe_retries.v1.keyed_mutation)` in `MethodOptions`.
pub const KEYED_MUTATION_OPTION_FIELD: u32 = 51205;

/// Reads the keyed-mutation option straight off the descriptor set's bytes: `prost-types` drops a
/// `MethodOptions` extension it does not know when it decodes, so only the path to it is decoded
/// here (files, their package and services, each service's name and methods, each method's name
/// and options), every other field skipped.
mod keyed_option {
    use grpc_core_api::GrpcMethod;
    use prost::Message;

    use super::CatalogError;

    #[derive(Clone, PartialEq, Message)]
    struct Set {
        #[prost(message, repeated, tag = "1")]
        file: Vec<File>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct File {
        #[prost(string, tag = "2")]
        package: String,
        #[prost(message, repeated, tag = "6")]
        service: Vec<Service>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Service {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, repeated, tag = "2")]
        method: Vec<Method>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Method {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, optional, tag = "4")]
        options: Option<Options>,
    }

    /// `MethodOptions` with only the extension this crate defines (its field number is
    /// [`KEYED_MUTATION_OPTION_FIELD`](super::KEYED_MUTATION_OPTION_FIELD)).
    #[derive(Clone, PartialEq, Message)]
    struct Options {
        #[prost(bool, tag = "51205")]
        keyed_mutation: bool,
    }

    /// The methods the set marks as keyed mutations.
    pub(super) fn methods_marked(bytes: &[u8]) -> Result<Vec<GrpcMethod>, CatalogError> {
        // The set itself decoded already; what fails here is field 51205 of some MethodOptions
        // with another type than this option's bool: another extension with the same number.
        let set = Set::decode(bytes).map_err(|e| {
            CatalogError::NotADescriptorSet(format!(
                "a method option numbered {} is not (grpc_safe_retries.v1.keyed_mutation), a \
                 bool: another extension uses its number ({e})",
                super::KEYED_MUTATION_OPTION_FIELD
            ))
        })?;
        let mut marked = Vec::new();
        for file in &set.file {
            for service in &file.service {
                let service_name = match file.package.as_str() {
                    "" => service.name.clone(),
                    package => format!("{package}.{}", service.name),
                };
                for method in &service.method {
                    if method.options.as_ref().is_some_and(|o| o.keyed_mutation) {
                        let full =
                            GrpcMethod::from_parts(&service_name, &method.name).map_err(|_| {
                                CatalogError::InvalidName(format!("{service_name}/{}", method.name))
                            })?;
                        marked.push(full);
                    }
                }
            }
        }
        Ok(marked)
    }
}
