//! `grpc-retry-lint`: checks a gRPC service config (gRFC A6 JSON) against the methods the service
//! really has (a protobuf `FileDescriptorSet`) and the channel's one retry owner, for users' CI.
//!
//! Exit codes: 0 when no finding is an error, 1 when one is, 2 when an input cannot be read.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use grpc_core_api::GrpcMethod;
use grpc_policy::{
    Finding, GrpcRetryOwner, GrpcRetryOwnershipValidator, MethodCatalog, ServiceConfig, Severity,
};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Owner {
    Channel,
    Application,
    Mesh,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Checks a gRPC service config against the service's descriptor set and the one-retry-owner
/// rule.
#[derive(Debug, Parser)]
#[command(name = "grpc-retry-lint", version)]
struct Args {
    /// The service config (gRFC A6 JSON).
    #[arg(long, value_name = "FILE.json")]
    service_config: std::path::PathBuf,
    /// The service's FileDescriptorSet (protoc --descriptor_set_out, or protox).
    #[arg(long, value_name = "FILE.pb")]
    descriptor_set: std::path::PathBuf,
    /// Which layer owns retries on this channel.
    #[arg(long, value_enum, default_value = "channel")]
    owner: Owner,
    /// A method that is a keyed mutation (`/package.Service/Method`); repeatable.
    #[arg(long = "keyed", value_name = "METHOD")]
    keyed: Vec<String>,
    /// Another layer that retries the same calls, as NAME=ATTEMPTS (`mesh=3`); repeatable.
    #[arg(long = "layer", value_name = "NAME=ATTEMPTS")]
    layers: Vec<String>,
    /// The largest number of attempts one call may become across all layers.
    #[arg(long, default_value_t = 10)]
    max_amplification: u32,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

/// An input that could not be read, with a message for the user.
struct Unreadable(String);

fn main() -> ExitCode {
    let args = Args::parse();
    match lint(&args) {
        Ok(findings) => {
            print(&findings, args.format);
            if findings.iter().any(|f| f.severity == Severity::Error) {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(Unreadable(message)) => {
            eprintln!("grpc-retry-lint: {message}");
            ExitCode::from(2)
        }
    }
}

fn lint(args: &Args) -> Result<Vec<Finding>, Unreadable> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Unreadable(format!("cannot read {}: {e}", path.display())))
    };
    let config_bytes = read(&args.service_config)?;
    let config_text = String::from_utf8(config_bytes)
        .map_err(|_| Unreadable(format!("{} is not UTF-8", args.service_config.display())))?;
    serde_json::from_str::<serde_json::Value>(&config_text).map_err(|e| {
        Unreadable(format!(
            "{} is not JSON: {e}",
            args.service_config.display()
        ))
    })?;
    let mut catalog = MethodCatalog::from_descriptor_set_bytes(&read(&args.descriptor_set)?)
        .map_err(|e| Unreadable(format!("{}: {e}", args.descriptor_set.display())))?;
    for keyed in &args.keyed {
        let method =
            GrpcMethod::parse(keyed).map_err(|e| Unreadable(format!("--keyed {keyed}: {e}")))?;
        catalog
            .mark_keyed_mutation(&method)
            .map_err(|e| Unreadable(format!("--keyed: {e}")))?;
    }
    let owner = match args.owner {
        Owner::Channel => GrpcRetryOwner::Channel,
        Owner::Application => GrpcRetryOwner::Application,
        Owner::Mesh => GrpcRetryOwner::Mesh,
        Owner::None => GrpcRetryOwner::None,
    };
    let mut validator =
        GrpcRetryOwnershipValidator::new(owner).with_amplification_bound(args.max_amplification);
    for layer in &args.layers {
        let (name, attempts) = layer
            .split_once('=')
            .and_then(|(n, a)| Some((n, a.parse::<u32>().ok()?)))
            .ok_or_else(|| Unreadable(format!("--layer {layer}: expected NAME=ATTEMPTS")))?;
        validator = validator.with_layer(name, attempts);
    }
    // A config A6 refuses is a finding (an error at its JSON path), not an unreadable input.
    let config = match ServiceConfig::parse(&config_text) {
        Ok(config) => config,
        Err(refusal) => {
            return Ok(vec![Finding {
                severity: Severity::Error,
                path: refusal.path,
                message: refusal.message,
            }]);
        }
    };
    Ok(validator.validate(&config, &catalog))
}

fn print(findings: &[Finding], format: Format) {
    match format {
        Format::Text => {
            for finding in findings {
                println!("{finding}");
            }
            let errors = findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .count();
            println!("{errors} error(s), {} warning(s)", findings.len() - errors);
        }
        Format::Json => {
            let list: Vec<_> = findings
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "severity": f.severity.to_string(),
                        "path": f.path,
                        "message": f.message,
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(list));
        }
    }
}
