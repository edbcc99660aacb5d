//! Any text: a method name is accepted only in its canonical form, and its parts rebuild it.
#![no_main]

use grpc_core_api::GrpcMethod;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(method) = GrpcMethod::parse(text) {
        assert_eq!(method.as_str(), text);
        assert_eq!(GrpcMethod::from_parts(method.service(), method.method()).as_ref(), Ok(&method));
    }
});
