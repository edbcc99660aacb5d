//! Why the demo hashes keys with a server secret: a short key under plain SHA-256 falls to a
//! brute force over its alphabet; under HMAC the same search without the secret finds nothing.
//! And the secret itself: at least 16 bytes, never shown.

use grpc_core_api::{IdempotencyKey, IdempotencyKeyHash, InvalidInput, KeyHasher};

const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Tries every key of up to three characters of the alphabet (47,989 candidates) under `hasher`.
fn brute_force(stored: &IdempotencyKeyHash, hasher: &KeyHasher) -> Option<String> {
    let mut candidates: Vec<String> = ALPHABET
        .iter()
        .map(|c| char::from(*c).to_string())
        .collect();
    for _ in 0..2 {
        let longer: Vec<String> = candidates
            .iter()
            .filter(|c| c.len() == candidates.last().map_or(0, String::len))
            .flat_map(|prefix| {
                ALPHABET
                    .iter()
                    .map(move |c| format!("{prefix}{}", char::from(*c)))
            })
            .collect();
        candidates.extend(longer);
    }
    assert_eq!(candidates.len(), 36 + 36 * 36 + 36 * 36 * 36);
    candidates
        .into_iter()
        .find(|candidate| hasher.hash(&IdempotencyKey::parse(candidate).unwrap()) == *stored)
}

#[test]
fn a_short_key_falls_to_brute_force_only_without_a_secret() {
    let key = IdempotencyKey::parse("k7z").unwrap();
    let plain = KeyHasher::Sha256.hash(&key);
    assert_eq!(
        brute_force(&plain, &KeyHasher::Sha256).as_deref(),
        Some("k7z")
    );

    let secret = KeyHasher::hmac_sha256(b"server-secret-held-by-the-service").unwrap();
    let keyed = secret.hash(&key);
    // The attacker has the stored hash but not the secret: neither plain hashing nor a guessed
    // secret finds the key.
    assert_eq!(brute_force(&keyed, &KeyHasher::Sha256), None);
    let guessed = KeyHasher::hmac_sha256(b"server-secret-guessed-by-attacker").unwrap();
    assert_eq!(brute_force(&keyed, &guessed), None);
    // With the secret, the service itself still recognises the key.
    assert_eq!(brute_force(&keyed, &secret).as_deref(), Some("k7z"));
}

/// The secret's floor is 16 bytes, inclusive; and no `Debug` form shows the secret.
#[test]
fn a_secret_of_sixteen_bytes_is_the_shortest_accepted_and_is_never_shown() {
    assert_eq!(
        KeyHasher::hmac_sha256(&[b's'; 15]).map(|_| ()),
        Err(InvalidInput::SecretTooShort { len: 15 })
    );
    let hasher = KeyHasher::hmac_sha256(b"sixteen-byte-sec").expect("16 bytes are enough");
    assert_eq!(format!("{hasher:?}"), "KeyHasher::HmacSha256(<secret>)");
    assert_eq!(format!("{:?}", KeyHasher::Sha256), "KeyHasher::Sha256");
}
