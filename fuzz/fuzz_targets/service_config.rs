//! Any text: the parser answers without panicking, every refusal names a JSON path, and an
//! accepted config emits JSON that parses back to the same model.
#![no_main]

use grpc_policy::ServiceConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ServiceConfig::parse(text) {
        Ok(config) => {
            let again = ServiceConfig::parse(&config.to_json().to_string())
                .expect("an emitted config parses");
            assert_eq!(again, config);
        }
        Err(error) => assert!(error.path.starts_with('$')),
    }
});
