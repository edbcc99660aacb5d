//! Downstream keys: the same for the same operation and label under the same hasher (every
//! resend, takeover and replica), different for any other label, caller, method, key or secret,
//! always a valid key, and never carrying the caller's key.

use std::collections::HashSet;

use grpc_core_api::{
    CallerFingerprint, DownstreamLabel, GrpcMethod, GrpcOperationIdentity, IdempotencyKey,
    InvalidInput, KeyHasher,
};
use proptest::prelude::*;

const METHOD: &str = "/payments.v1.Payments/CreatePayment";

fn identity(hasher: &KeyHasher, caller: &str, method: &str, key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(caller.as_bytes()),
        GrpcMethod::parse(method).unwrap(),
        hasher.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

fn label(text: &str) -> DownstreamLabel {
    DownstreamLabel::parse(text).unwrap()
}

fn secret(byte: u8) -> KeyHasher {
    KeyHasher::hmac_sha256(&[byte; 32]).unwrap()
}

#[test]
fn a_downstream_key_is_stable_and_its_own_per_label_operation_and_secret() {
    let hasher = secret(7);
    let operation = identity(&hasher, "tenant-a", METHOD, "pay-42");
    let postings = hasher.downstream_key(&operation, &label("postings"));
    // Another replica (a hasher built again from the same secret), a resend, a takeover: the
    // operation's identity is the same, and so is the key.
    let again = secret(7).downstream_key(
        &identity(&secret(7), "tenant-a", METHOD, "pay-42"),
        &label("postings"),
    );
    assert_eq!(postings, again);
    assert!(postings.expose().starts_with("dk1-") && postings.expose().len() == 68);

    let others = [
        hasher.downstream_key(&operation, &label("provider.charge")),
        hasher.downstream_key(
            &identity(&hasher, "tenant-b", METHOD, "pay-42"),
            &label("postings"),
        ),
        hasher.downstream_key(
            &identity(
                &hasher,
                "tenant-a",
                "/payments.v1.Payments/RefundPayment",
                "pay-42",
            ),
            &label("postings"),
        ),
        hasher.downstream_key(
            &identity(&hasher, "tenant-a", METHOD, "pay-43"),
            &label("postings"),
        ),
        secret(8).downstream_key(
            &identity(&secret(8), "tenant-a", METHOD, "pay-42"),
            &label("postings"),
        ),
        KeyHasher::Sha256.downstream_key(
            &identity(&KeyHasher::Sha256, "tenant-a", METHOD, "pay-42"),
            &label("postings"),
        ),
    ];
    // The ledger's row holds the operation's identity; whoever reads it without the secret must
    // not be able to derive the downstream key: another secret over the same identity gives
    // another key.
    let same_identity_other_secret = secret(8).downstream_key(&operation, &label("postings"));
    assert_ne!(same_identity_other_secret, postings);
    let mut seen: HashSet<String> = HashSet::from([postings.expose().to_owned()]);
    for other in &others {
        assert!(
            seen.insert(other.expose().to_owned()),
            "a key repeated: {other:?}"
        );
    }
}

#[test]
fn labels_are_short_plain_names() {
    for good in [
        "postings",
        "provider.charge",
        "step_2",
        "a-b",
        &"x".repeat(64),
    ] {
        assert!(DownstreamLabel::parse(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "has space",
        "new\nline",
        "pipe|",
        "ünï",
        &"x".repeat(65),
    ] {
        assert_eq!(
            DownstreamLabel::parse(bad),
            Err(InvalidInput::DownstreamLabelMalformed),
            "{bad:?}"
        );
    }
}

proptest! {
    /// Whatever the caller's key, the downstream key is a valid key that does not contain it (nor
    /// its hash), and two labels never share a key.
    #[test]
    fn a_downstream_key_never_carries_the_callers_key(
        key in "[!-~]{8,64}",
        first in "[a-z]{1,10}",
        second in "[a-z]{1,10}",
    ) {
        let hasher = secret(3);
        let operation = identity(&hasher, "tenant-a", METHOD, &key);
        let derived = hasher.downstream_key(&operation, &label(&first));
        prop_assert!(IdempotencyKey::parse(derived.expose()).is_ok());
        prop_assert!(!derived.expose().contains(key.as_str()));
        prop_assert!(!derived.expose().contains(&operation.key_hash().to_hex()));
        if first != second {
            prop_assert_ne!(derived, hasher.downstream_key(&operation, &label(&second)));
        }
    }
}
