//! Compiles the demo's .proto with protox (no protoc needed) and generates the tonic code; also
//! writes the descriptor set, which the demo validates its service config against. The set is
//! encoded by the compiler itself, which keeps extension options (CreatePayment's
//! `(grpc_safe_retries.v1.keyed_mutation)`); an encoding through prost-types would drop them.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/payments.proto");
    println!("cargo:rerun-if-changed=../grpc-policy/proto/grpc_safe_retries/v1/options.proto");
    let mut compiler = protox::Compiler::new(["proto", "../grpc-policy/proto"])?;
    compiler.include_imports(true);
    compiler.open_files(["payments.proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("payments.pb"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
