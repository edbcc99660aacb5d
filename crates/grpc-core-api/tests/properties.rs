//! Property tests of the parsers: every valid input is accepted unchanged, every invalid one is
//! refused, and no error message ever repeats the key it refused.

use grpc_core_api::{GrpcMethod, IdempotencyKey, InvalidInput, KeyHasher, RequestFingerprint};
use proptest::prelude::*;

const IDENT: &str = "[A-Za-z_][A-Za-z0-9_]{0,12}";

proptest! {
    #[test]
    fn every_visible_ascii_key_up_to_255_bytes_is_accepted(key in "[!-~]{1,255}") {
        let parsed = IdempotencyKey::parse(&key).expect("valid key");
        prop_assert_eq!(parsed.expose(), key.as_str());
    }

    #[test]
    fn keys_with_an_invisible_byte_are_refused_without_echoing_the_key(
        prefix in "[!-~]{8,40}",
        bad in prop::sample::select(vec![' ', '\t', '\n', '\0', '\u{7f}', '\u{e9}', '\u{2028}']),
        suffix in "[!-~]{0,40}",
    ) {
        let key = format!("{prefix}{bad}{suffix}");
        let error = IdempotencyKey::parse(&key).expect_err("invisible byte");
        prop_assert_eq!(&error, &InvalidInput::KeyByteNotVisibleAscii { position: prefix.len() });
        let message = error.to_string();
        prop_assert!(!message.contains(&prefix), "{}", message);
    }

    #[test]
    fn methods_built_from_identifiers_round_trip(
        package in prop::collection::vec(IDENT, 0..4),
        service in IDENT,
        method in IDENT,
    ) {
        let mut full_service = package.join(".");
        if !full_service.is_empty() {
            full_service.push('.');
        }
        full_service.push_str(&service);
        let name = format!("/{full_service}/{method}");
        let parsed = GrpcMethod::parse(&name).expect("valid method");
        prop_assert_eq!(parsed.as_str(), name.as_str());
        prop_assert_eq!(parsed.service(), full_service.as_str());
        prop_assert_eq!(parsed.method(), method.as_str());
    }

    #[test]
    fn method_parser_never_panics_and_accepts_only_canonical_names(name in "\\PC{0,40}") {
        if let Ok(parsed) = GrpcMethod::parse(&name) {
            prop_assert_eq!(parsed.as_str(), name.as_str());
            prop_assert!(name.starts_with('/'));
            prop_assert_eq!(name.matches('/').count(), 2);
        }
    }

    #[test]
    fn digests_round_trip_through_hex(bytes in prop::collection::vec(any::<u8>(), 0..64), key in "[!-~]{1,64}") {
        let fingerprint = RequestFingerprint::of(&bytes);
        prop_assert_eq!(RequestFingerprint::from_hex(&fingerprint.to_hex()), Ok(fingerprint));
        let hash = KeyHasher::Sha256.hash(&IdempotencyKey::parse(&key).expect("valid"));
        prop_assert_eq!(grpc_core_api::IdempotencyKeyHash::from_hex(&hash.to_hex()), Ok(hash));
    }
}
