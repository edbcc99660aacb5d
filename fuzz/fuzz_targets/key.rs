//! Any bytes: a key is accepted only as 1 to 255 bytes of visible ASCII, and a refusal's message
//! depends only on the key's length and where it went wrong, never on its content.
#![no_main]

use grpc_core_api::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match IdempotencyKey::parse_bytes(data) {
        Ok(key) => {
            assert!((1..=255).contains(&data.len()));
            assert!(data.iter().all(|b| (0x21..=0x7e).contains(b)));
            assert_eq!(key.expose().as_bytes(), data);
        }
        Err(error) => {
            let masked: Vec<u8> = data.iter().map(|b| if b.is_ascii_graphic() { b'x' } else { *b }).collect();
            let masked_error = IdempotencyKey::parse_bytes(&masked).expect_err("the same shape is refused");
            assert_eq!(error.to_string(), masked_error.to_string());
        }
    }
});
