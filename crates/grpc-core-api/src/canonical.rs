//! A canonical form of protobuf requests, so that equal requests get equal fingerprints.
//!
//! Protobuf's wire encoding is not canonical: map entries come in whatever order the sender's map
//! iterates (prost decodes `map<..>` into a `HashMap` with a per-instance random seed, so even
//! re-encoding one decoded message twice gives different bytes), fields may arrive in any order, a
//! default value may or may not be sent, and repeated scalars may be packed or not. The request
//! fingerprint is computed over a form of its own instead, read with the service's schema
//! (decision and alternatives in `docs/adr/0006-canonical-request-fingerprint.md`):
//!
//! - fields in field-number order, each tagged with its number;
//! - a field without explicit presence (a proto3 scalar, string, bytes, enum, repeated or map
//!   field) is written only when it differs from its default, so sending the default explicitly is
//!   the same request as not sending it; a field with explicit presence (a message field, a proto3
//!   `optional`, a `oneof` member, proto2) is written whenever it is set, since the handler can
//!   tell those apart;
//! - map entries sorted by their canonical key, at every depth;
//! - every value self-delimiting (fixed-width numbers, length-prefixed strings, bytes, messages,
//!   lists and maps), so two different requests never share a canonical form;
//! - `google.protobuf.Any` whose type the schema knows is canonicalised as that message, named by
//!   its full type name (the URL's host part is not part of the type); an `Any` of a type the
//!   schema does not know, or nested inside more than eight others, is taken as its type URL and
//!   raw bytes;
//! - fields the schema does not declare are not part of the fingerprint: the server decoded the
//!   request with this schema, so its handler never sees them, and a request that differs only
//!   there is the same request to this server.

use std::collections::HashMap;

use prost::Message;
use prost_reflect::{
    DescriptorPool, DynamicMessage, Kind, MessageDescriptor, ReflectMessage, Value,
};
use sha2::{Digest, Sha256};

use crate::{GrpcMethod, RequestFingerprint};

/// What the fingerprint's digest starts with: the form's name and version, so that a future form
/// can never collide with this one.
const FORM_TAG: &[u8] = b"grpc-safe-retries/canonical-request/v1\0";

const ANY_TYPE: &str = "google.protobuf.Any";

/// How many `Any`s inside one another are unpacked on one path; deeper ones are taken as their
/// URL and bytes. Each unpacking decodes its bytes afresh (prost's recursion limit starts again
/// there), so without a bound a request of `Any`s nested thousands deep (a few hundred KB) would
/// exhaust the stack and cost time quadratic in its size.
const MAX_ANY_UNPACKING: u32 = 8;

/// Why a request could not be fingerprinted. Each is a deployment mistake on the server (its
/// schema does not describe its own methods), never the caller's: gRPC status INTERNAL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The bytes are not a `google.protobuf.FileDescriptorSet`, or its files do not link.
    #[error("the request schema is not a valid file descriptor set: {reason}")]
    DescriptorSetInvalid {
        /// What the descriptor decoder said (names of files and types, no request data).
        reason: String,
    },
    /// The schema has no such method.
    #[error("the request schema has no method {method}")]
    MethodNotInSchema {
        /// The method asked for.
        method: String,
    },
    /// The request's bytes do not decode as the method's input type.
    #[error("the request does not decode as {message_type}")]
    RequestDoesNotMatchSchema {
        /// The input type of the method.
        message_type: String,
    },
    /// A method's idempotency key was configured to come from a field its input type does not
    /// have as a singular top-level `string`.
    #[error("{message_type} has no singular string field {field} to read an idempotency key from")]
    KeyFieldNotAString {
        /// The input type of the method.
        message_type: String,
        /// The field named.
        field: String,
    },
    /// The message type the server decoded has fields the schema does not declare: the
    /// descriptor set is older than the code.
    #[error(
        "{message_type} has fields the request schema does not declare; the descriptor set is \
         older than the code"
    )]
    RequestTypeDiffersFromSchema {
        /// The input type of the method.
        message_type: String,
    },
}

impl From<SchemaError> for tonic::Status {
    fn from(error: SchemaError) -> Self {
        tonic::Status::internal(error.to_string())
    }
}

/// The protobuf schema of a service's requests, read from its `FileDescriptorSet`: what turns a
/// request into its [`RequestFingerprint`].
///
/// ```
/// # fn demo(descriptor_set: &[u8], request: &impl prost::Message) -> Result<(), grpc_core_api::SchemaError> {
/// use grpc_core_api::{GrpcMethod, RequestSchema};
/// let schema = RequestSchema::from_file_descriptor_set(descriptor_set)?;
/// let method = GrpcMethod::parse("/payments.v1.Payments/CreatePayment").expect("a method name");
/// let fingerprint = schema.fingerprint_message(&method, request)?;
/// # let _ = fingerprint; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RequestSchema {
    /// The input type of every method of every service, by full method name
    /// (`/package.Service/Method`).
    inputs: HashMap<String, MessageDescriptor>,
    pool: DescriptorPool,
}

impl RequestSchema {
    /// Reads an encoded `google.protobuf.FileDescriptorSet` (what `protoc
    /// --descriptor_set_out --include_imports`, `protox` or tonic-build's
    /// `file_descriptor_set_path` write).
    pub fn from_file_descriptor_set(encoded: &[u8]) -> Result<Self, SchemaError> {
        let pool =
            DescriptorPool::decode(encoded).map_err(|error| SchemaError::DescriptorSetInvalid {
                reason: error.to_string(),
            })?;
        Ok(Self::from_pool(pool))
    }

    /// The schema of every service in `pool`.
    pub fn from_pool(pool: DescriptorPool) -> Self {
        let inputs = pool
            .services()
            .flat_map(|service| service.methods().collect::<Vec<_>>())
            .map(|method| {
                let name = format!("/{}/{}", method.parent_service().full_name(), method.name());
                (name, method.input())
            })
            .collect();
        Self { inputs, pool }
    }

    /// The fingerprint of a request to `method`, given as its encoded bytes.
    pub fn fingerprint(
        &self,
        method: &GrpcMethod,
        encoded_request: &[u8],
    ) -> Result<RequestFingerprint, SchemaError> {
        let canonical = self.canonical_form(method, encoded_request)?;
        Ok(RequestFingerprint::from_digest(
            Sha256::digest(&canonical).into(),
        ))
    }

    /// The fingerprint of a request to `method`, given as the message the server decoded (what a
    /// tonic handler receives).
    ///
    /// The message's own encoding can hold no field its type does not declare (the server's
    /// decoder dropped any), so a field the schema does not know means the schema is older than
    /// the code: two requests differing only there would get one fingerprint and the second would
    /// replay the first. That is refused (`RequestTypeDiffersFromSchema`) rather than hashed.
    pub fn fingerprint_message(
        &self,
        method: &GrpcMethod,
        request: &impl Message,
    ) -> Result<RequestFingerprint, SchemaError> {
        Ok(self.fingerprint_message_with_key(method, request, None)?.0)
    }

    /// [`fingerprint_message`](Self::fingerprint_message), and the text of the request's string
    /// field `key_field` when one is named (`None` when it holds the empty string, proto3's
    /// "not set"): where a method carries its idempotency key in its request, as Google's APIs
    /// carry `request_id` (AIP-155). One decoding serves both, and the fingerprint is of the
    /// request without its key.
    pub fn fingerprint_message_with_key(
        &self,
        method: &GrpcMethod,
        request: &impl Message,
        key_field: Option<&str>,
    ) -> Result<(RequestFingerprint, Option<String>), SchemaError> {
        let (input, mut message) = self.decode(method, &request.encode_to_vec())?;
        if has_unknown_fields(&message) {
            return Err(SchemaError::RequestTypeDiffersFromSchema {
                message_type: input.full_name().to_owned(),
            });
        }
        // The key is not part of the request it names: left in, the stored fingerprint would be a
        // plain digest of the key and a guessable body (what the keyed hash of the key exists to
        // prevent), and a resend that adds the same key to the body would be another request.
        let key = match key_field {
            None => None,
            Some(field) => {
                let descriptor = key_field_of(&input, field)?;
                let key = match message.get_field(&descriptor).as_ref() {
                    Value::String(text) if !text.is_empty() => Some(text.clone()),
                    _ => None,
                };
                message.clear_field(&descriptor);
                key
            }
        };
        let fingerprint =
            RequestFingerprint::from_digest(Sha256::digest(self.form(&input, &message)).into());
        Ok((fingerprint, key))
    }

    /// Checks that `method`'s input type has a singular top-level `string` field `field`, to read
    /// an idempotency key from.
    pub fn check_key_field(&self, method: &GrpcMethod, field: &str) -> Result<(), SchemaError> {
        key_field_of(self.input(method)?, field).map(|_| ())
    }

    /// The methods whose input type has a singular top-level `string` field named `request_id`:
    /// where Google's APIs carry a request's idempotency key (AIP-155).
    pub fn methods_with_request_id(&self) -> Vec<GrpcMethod> {
        let mut methods: Vec<GrpcMethod> = self
            .inputs
            .iter()
            .filter(|(_, input)| key_field_of(input, AIP_155_FIELD).is_ok())
            .filter_map(|(name, _)| GrpcMethod::parse(name).ok())
            .collect();
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods
    }

    fn input(&self, method: &GrpcMethod) -> Result<&MessageDescriptor, SchemaError> {
        self.inputs
            .get(method.as_str())
            .ok_or_else(|| SchemaError::MethodNotInSchema {
                method: method.as_str().to_owned(),
            })
    }

    /// The canonical form itself, whose SHA-256 is the fingerprint: for tests and for readers who
    /// want to see what is compared.
    pub fn canonical_form(
        &self,
        method: &GrpcMethod,
        encoded_request: &[u8],
    ) -> Result<Vec<u8>, SchemaError> {
        let (input, message) = self.decode(method, encoded_request)?;
        Ok(self.form(&input, &message))
    }

    /// The request decoded as `method`'s input type.
    fn decode(
        &self,
        method: &GrpcMethod,
        encoded_request: &[u8],
    ) -> Result<(MessageDescriptor, DynamicMessage), SchemaError> {
        let input = self.input(method)?;
        let message = DynamicMessage::decode(input.clone(), encoded_request).map_err(|_| {
            SchemaError::RequestDoesNotMatchSchema {
                message_type: input.full_name().to_owned(),
            }
        })?;
        Ok((input.clone(), message))
    }

    fn form(&self, input: &MessageDescriptor, message: &DynamicMessage) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(FORM_TAG);
        write_bytes(&mut out, input.full_name().as_bytes());
        self.write_message(&mut out, message, MAX_ANY_UNPACKING);
        out
    }

    /// `anys_left`: how many more nested `Any`s may be unpacked on this path.
    fn write_message(&self, out: &mut Vec<u8>, message: &DynamicMessage, anys_left: u32) {
        // `fields` yields exactly the fields `has_field` reports: set ones with explicit presence,
        // non-default ones without. Unknown fields are not among them.
        let mut fields: Vec<_> = message.fields().collect();
        fields.sort_by_key(|(field, _)| field.number());
        for (field, value) in fields {
            write_varint(out, u64::from(field.number()));
            self.write_value(out, &field.kind(), value, anys_left);
        }
    }

    fn write_value(&self, out: &mut Vec<u8>, kind: &Kind, value: &Value, anys_left: u32) {
        match value {
            Value::Bool(v) => out.push(u8::from(*v)),
            Value::I32(v) => out.extend_from_slice(&i64::from(*v).to_le_bytes()),
            Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::U32(v) => out.extend_from_slice(&u64::from(*v).to_le_bytes()),
            Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::F32(v) => out.extend_from_slice(&v.to_bits().to_le_bytes()),
            Value::F64(v) => out.extend_from_slice(&v.to_bits().to_le_bytes()),
            Value::EnumNumber(v) => out.extend_from_slice(&i64::from(*v).to_le_bytes()),
            Value::String(v) => write_bytes(out, v.as_bytes()),
            Value::Bytes(v) => write_bytes(out, v),
            Value::Message(v) => {
                let nested = self.message_form(v, anys_left);
                write_bytes(out, &nested);
            }
            Value::List(items) => {
                write_varint(out, items.len() as u64);
                for item in items {
                    self.write_value(out, kind, item, anys_left);
                }
            }
            Value::Map(entries) => {
                // A map field's kind is always its entry message.
                let (key_kind, value_kind) = match kind {
                    Kind::Message(entry) => (
                        entry.map_entry_key_field().kind(),
                        entry.map_entry_value_field().kind(),
                    ),
                    other => (other.clone(), other.clone()),
                };
                // A key is written as the value it is (fixed-width number, length-prefixed
                // string), and entries are ordered by those bytes.
                let mut sorted: Vec<(Vec<u8>, &Value)> = entries
                    .iter()
                    .map(|(key, value)| {
                        let mut form = Vec::new();
                        self.write_value(
                            &mut form,
                            &key_kind,
                            &Value::from(key.clone()),
                            anys_left,
                        );
                        (form, value)
                    })
                    .collect();
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                write_varint(out, sorted.len() as u64);
                for (key, value) in sorted {
                    out.extend_from_slice(&key);
                    self.write_value(out, &value_kind, value, anys_left);
                }
            }
        }
    }

    /// A nested message's canonical form; `Any` is unpacked when the schema knows its type and
    /// the path has unpacked fewer than [`MAX_ANY_UNPACKING`] before it.
    fn message_form(&self, message: &DynamicMessage, anys_left: u32) -> Vec<u8> {
        let mut out = Vec::new();
        if message.descriptor().full_name() == ANY_TYPE {
            if anys_left > 0
                && let Some((type_name, unpacked)) = self.unpack_any(message)
            {
                out.push(1);
                write_bytes(&mut out, type_name.as_bytes());
                self.write_message(&mut out, &unpacked, anys_left - 1);
                return out;
            }
            out.push(0);
        }
        self.write_message(&mut out, message, anys_left);
        out
    }

    /// The type name and decoded value of an `Any` whose type the schema knows.
    fn unpack_any(&self, any: &DynamicMessage) -> Option<(String, DynamicMessage)> {
        let type_url = any.get_field_by_number(1)?;
        let value = any.get_field_by_number(2)?;
        let (Value::String(type_url), Value::Bytes(value)) = (type_url.as_ref(), value.as_ref())
        else {
            return None;
        };
        let type_name = type_url.rsplit('/').next()?;
        let descriptor = self.pool.get_message_by_name(type_name)?;
        let decoded = DynamicMessage::decode(descriptor, value.as_ref()).ok()?;
        Some((type_name.to_owned(), decoded))
    }
}

/// AIP-155's name for the field that carries a request's idempotency key.
const AIP_155_FIELD: &str = "request_id";

/// `input`'s singular top-level `string` field `field`.
fn key_field_of(
    input: &MessageDescriptor,
    field: &str,
) -> Result<prost_reflect::FieldDescriptor, SchemaError> {
    input
        .get_field_by_name(field)
        .filter(|descriptor| {
            matches!(descriptor.kind(), Kind::String)
                && !descriptor.is_list()
                && !descriptor.is_map()
        })
        .ok_or_else(|| SchemaError::KeyFieldNotAString {
            message_type: input.full_name().to_owned(),
            field: field.to_owned(),
        })
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Whether `message`, or any message inside it, holds fields its descriptor does not declare
/// (an `Any`'s packed bytes are not looked into).
fn has_unknown_fields(message: &DynamicMessage) -> bool {
    fn value_has(value: &Value) -> bool {
        match value {
            Value::Message(message) => has_unknown_fields(message),
            Value::List(items) => items.iter().any(value_has),
            Value::Map(entries) => entries.values().any(value_has),
            _ => false,
        }
    }
    message.unknown_fields().next().is_some() || message.fields().any(|(_, value)| value_has(value))
}
