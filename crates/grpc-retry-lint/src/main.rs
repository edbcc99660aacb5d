//! `grpc-retry-lint`: checks gRPC service configs (gRFC A6 JSON) against the methods the service
//! really has (its .proto files, or a compiled `FileDescriptorSet`) and the channel's one retry
//! owner, for users' CI and pre-commit hooks.
//!
//! Every finding is reported, whatever else is wrong in a config: a config the clients would
//! refuse still gets each problem at its own JSON path, and every stale name behind it.
//!
//! Exit codes: 0 when no finding is an error (and, under `--deny warnings`, none is a warning);
//! 1 when one is; 2 when an input cannot be read (a missing file, a config that is not JSON, protos
//! that do not compile).

mod locate;
mod output;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use grpc_core_api::GrpcMethod;
use grpc_policy::{
    Finding, GrpcRetryOwner, GrpcRetryOwnershipValidator, LedgerKnowledge, MethodCatalog,
    ServiceConfig, Severity,
};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Owner {
    Channel,
    Application,
    Mesh,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Ledger {
    /// The server keeps a durable operation ledger: retrying keyed mutations is expected.
    Durable,
    /// It does not: retrying a keyed mutation is an error.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Deny {
    /// Exit 1 on warnings too.
    Warnings,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// `file:line:column: severity[rule]: message`, then a summary per config and a total.
    Text,
    /// One JSON document with every config's findings.
    Json,
    /// SARIF 2.1.0, for GitHub and GitLab code scanning.
    Sarif,
    /// GitHub Actions workflow commands (annotations on the pull request).
    Github,
}

/// Checks gRPC service configs against the service's protos and the one-retry-owner rule.
#[derive(Debug, Parser)]
#[command(name = "grpc-retry-lint", version)]
struct Args {
    /// Service configs to check: files, or directories searched (recursively) for
    /// `*service_config*.json`.
    #[arg(value_name = "CONFIG_OR_DIR")]
    configs: Vec<PathBuf>,
    /// A service config to check (the same as a positional argument); repeatable.
    #[arg(long = "service-config", value_name = "FILE.json")]
    service_configs: Vec<PathBuf>,
    /// The service's FileDescriptorSet (protoc --descriptor_set_out --include_imports, protox).
    #[arg(long, value_name = "FILE.pb", conflicts_with_all = ["protos", "protos_beside"])]
    descriptor_set: Option<PathBuf>,
    /// A .proto file of the service, compiled here (no protoc needed); repeatable.
    #[arg(long = "proto", value_name = "FILE.proto")]
    protos: Vec<PathBuf>,
    /// A directory imports are resolved from; repeatable.
    #[arg(long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// Compile, for each config, every .proto in the config's own directory and below it (a
    /// googleapis-style tree: pass its root with --include).
    #[arg(long, conflicts_with = "protos")]
    protos_beside: bool,
    /// Which layer owns retries on this channel.
    #[arg(long, value_enum, default_value = "channel")]
    owner: Owner,
    /// A method that is a keyed mutation (`/package.Service/Method`); repeatable.
    #[arg(long = "keyed", value_name = "METHOD")]
    keyed: Vec<String>,
    /// A method declared non-idempotent (a retry covering it is an error); repeatable.
    #[arg(long = "non-idempotent", value_name = "METHOD")]
    non_idempotent: Vec<String>,
    /// What the server keeps for keyed mutations.
    #[arg(long, value_enum)]
    ledger: Option<Ledger>,
    /// Make a retry covering a method of undeclared idempotency an error.
    #[arg(long)]
    strict: bool,
    /// `warnings`: exit 1 on warnings too.
    #[arg(long, value_enum)]
    deny: Vec<Deny>,
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

/// The findings of one config, each with its place in the file.
pub(crate) struct Checked {
    pub(crate) file: PathBuf,
    pub(crate) findings: Vec<Located>,
}

/// A finding and where it is in its file.
pub(crate) struct Located {
    pub(crate) finding: Finding,
    pub(crate) line: usize,
    pub(crate) column: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let files = match config_files(&args) {
        Ok(files) => files,
        Err(Unreadable(message)) => {
            eprintln!("grpc-retry-lint: {message}");
            return ExitCode::from(2);
        }
    };
    let validator = match validator(&args) {
        Ok(validator) => validator,
        Err(Unreadable(message)) => {
            eprintln!("grpc-retry-lint: {message}");
            return ExitCode::from(2);
        }
    };
    let mut catalogs = Catalogs::new(&args);
    let mut checked = Vec::new();
    let mut unreadable = false;
    for file in files {
        match check(&file, &mut catalogs, &validator) {
            Ok(findings) => checked.push(Checked { file, findings }),
            Err(Unreadable(message)) => {
                eprintln!("grpc-retry-lint: {message}");
                unreadable = true;
            }
        }
    }
    let unmatched = catalogs.unmatched_marks();
    if !unmatched.is_empty() && !checked.is_empty() {
        eprintln!(
            "grpc-retry-lint: --keyed/--non-idempotent {} matches no service of the checked \
             configs' protos (a typo?)",
            unmatched.join(", ")
        );
        unreadable = true;
    }
    output::print(&checked, args.format);
    let count = |severity| {
        checked
            .iter()
            .flat_map(|c| &c.findings)
            .filter(|f| f.finding.severity == severity)
            .count()
    };
    if unreadable {
        ExitCode::from(2)
    } else if count(Severity::Error) > 0
        || (args.deny.contains(&Deny::Warnings) && count(Severity::Warning) > 0)
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The configs to check, in a stable order.
fn config_files(args: &Args) -> Result<Vec<PathBuf>, Unreadable> {
    let mut files = Vec::new();
    for path in args.configs.iter().chain(&args.service_configs) {
        if path.is_dir() {
            find_configs(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err(Unreadable(
            "no service config given (pass files or directories)".to_owned(),
        ));
    }
    Ok(files)
}

fn find_configs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Unreadable> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Unreadable(format!("cannot read {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            find_configs(&path, out)?;
        } else if name.ends_with(".json") && name.contains("service_config") {
            out.push(path);
        }
    }
    Ok(())
}

fn validator(args: &Args) -> Result<GrpcRetryOwnershipValidator, Unreadable> {
    let owner = match args.owner {
        Owner::Channel => GrpcRetryOwner::Channel,
        Owner::Application => GrpcRetryOwner::Application,
        Owner::Mesh => GrpcRetryOwner::Mesh,
        Owner::None => GrpcRetryOwner::None,
    };
    let mut validator =
        GrpcRetryOwnershipValidator::new(owner).with_amplification_bound(args.max_amplification);
    if args.strict {
        validator = validator.strict();
    }
    validator = validator.with_ledger(match args.ledger {
        None => LedgerKnowledge::Unknown,
        Some(Ledger::Durable) => LedgerKnowledge::Durable,
        Some(Ledger::None) => LedgerKnowledge::None,
    });
    for layer in &args.layers {
        let (name, attempts) = layer
            .split_once('=')
            .and_then(|(n, a)| Some((n, a.parse::<u32>().ok()?)))
            .ok_or_else(|| Unreadable(format!("--layer {layer}: expected NAME=ATTEMPTS")))?;
        validator = validator.with_layer(name, attempts);
    }
    Ok(validator)
}

/// Where the methods come from, compiled once per source.
struct Catalogs<'a> {
    args: &'a Args,
    /// The `--keyed` and `--non-idempotent` methods some catalog of the run declared.
    matched_marks: std::cell::RefCell<std::collections::BTreeSet<String>>,
    /// By the directory whose protos were compiled (`None`: the one source for every config).
    compiled: BTreeMap<Option<PathBuf>, MethodCatalog>,
}

impl<'a> Catalogs<'a> {
    fn new(args: &'a Args) -> Self {
        Self {
            args,
            matched_marks: Default::default(),
            compiled: BTreeMap::new(),
        }
    }

    /// The marks of the command line that matched no service of any config checked: typos, which
    /// would otherwise leave the method undeclared and its retry a mere warning.
    fn unmatched_marks(&self) -> Vec<String> {
        let matched = self.matched_marks.borrow();
        self.args
            .keyed
            .iter()
            .chain(&self.args.non_idempotent)
            .filter(|mark| !matched.contains(*mark))
            .cloned()
            .collect()
    }

    /// The catalog for `config`, with the command line's marks applied.
    fn for_config(&mut self, config: &Path) -> Result<&MethodCatalog, Unreadable> {
        let key = self
            .args
            .protos_beside
            .then(|| config.parent().unwrap_or(Path::new(".")).to_path_buf());
        if !self.compiled.contains_key(&key) {
            let catalog = self.build(key.as_deref())?;
            self.compiled.insert(key.clone(), catalog);
        }
        Ok(&self.compiled[&key])
    }

    fn build(&self, beside: Option<&Path>) -> Result<MethodCatalog, Unreadable> {
        let args = self.args;
        let bytes = if let Some(set) = &args.descriptor_set {
            std::fs::read(set)
                .map_err(|e| Unreadable(format!("cannot read {}: {e}", set.display())))?
        } else {
            let (protos, includes) = match beside {
                Some(dir) => (protos_in(dir)?, includes_for(&args.includes, dir)),
                None => (
                    args.protos.clone(),
                    includes_for(&args.includes, Path::new(".")),
                ),
            };
            if protos.is_empty() {
                return Err(Unreadable(match beside {
                    Some(dir) => format!("no .proto file in {}", dir.display()),
                    None => "say where the methods are: --proto FILE (with --include DIR), \
                             --protos-beside, or --descriptor-set FILE"
                        .to_owned(),
                }));
            }
            compile(&protos, &includes)
                .map_err(|e| Unreadable(format!("the protos do not compile: {e}")))?
        };
        let mut catalog = MethodCatalog::from_descriptor_set_bytes(&bytes)
            .map_err(|e| Unreadable(format!("the descriptor set: {e}")))?;
        for (flag, methods) in [
            ("--keyed", &args.keyed),
            ("--non-idempotent", &args.non_idempotent),
        ] {
            for name in methods {
                let method = GrpcMethod::parse(name)
                    .map_err(|e| Unreadable(format!("{flag} {name}: {e}")))?;
                // A mark for another config's service is not this config's concern; a method
                // this service does not have is a typo. A mark no catalog of the run declares is
                // reported at the end (`Catalogs::unmatched_marks`).
                if catalog.get(&method).is_none() && !catalog.declares_service(method.service()) {
                    continue;
                }
                self.matched_marks.borrow_mut().insert(name.clone());
                let marked = if flag == "--keyed" {
                    catalog.mark_keyed_mutation(&method)
                } else {
                    catalog.mark_non_idempotent(&method)
                };
                marked.map_err(|e| Unreadable(format!("{flag}: {e}")))?;
            }
        }
        Ok(catalog)
    }
}

/// Every .proto in `dir` and its subdirectories (a versioned API keeps its services in
/// subdirectories beside the config, as googleapis' Ads APIs do).
fn protos_in(dir: &Path) -> Result<Vec<PathBuf>, Unreadable> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Unreadable(format!("cannot read {}: {e}", dir.display())))?;
    let mut protos = Vec::new();
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.is_dir() {
            protos.extend(protos_in(&path)?);
        } else if path.extension().is_some_and(|e| e == "proto") {
            protos.push(path);
        }
    }
    protos.sort();
    Ok(protos)
}

/// The import roots: the ones given, else the directory of the protos itself.
fn includes_for(given: &[PathBuf], fallback: &Path) -> Vec<PathBuf> {
    if given.is_empty() {
        vec![fallback.to_path_buf()]
    } else {
        given.to_vec()
    }
}

fn check(
    file: &Path,
    catalogs: &mut Catalogs<'_>,
    validator: &GrpcRetryOwnershipValidator,
) -> Result<Vec<Located>, Unreadable> {
    let bytes = std::fs::read(file)
        .map_err(|e| Unreadable(format!("cannot read {}: {e}", file.display())))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Unreadable(format!("{} is not UTF-8", file.display())))?;
    let (config, problems) = ServiceConfig::parse_collecting(&text).map_err(|e| {
        Unreadable(format!(
            "{} is not a service config: {}",
            file.display(),
            e.message
        ))
    })?;
    let catalog = catalogs
        .for_config(file)
        .map_err(|Unreadable(message)| Unreadable(format!("{}: {message}", file.display())))?;
    Ok(validator
        .validate_with_problems(&config, &problems, catalog)
        .into_iter()
        .map(|finding| {
            let (line, column) = place(&text, &finding.path);
            Located {
                finding,
                line,
                column,
            }
        })
        .collect())
}

/// Where `path` is in `text`; for a value that is missing (a required field left out), where its
/// nearest enclosing value is.
fn place(text: &str, path: &str) -> (usize, usize) {
    let mut path = path;
    loop {
        if let Some(found) = locate::locate(text, path) {
            return found;
        }
        match path.rfind(['.', '[']) {
            Some(cut) if cut > 0 => path = &path[..cut],
            _ => return (1, 1),
        }
    }
}

/// Compiles `protos` into an encoded descriptor set that keeps extension options (a method's
/// `(grpc_safe_retries.v1.keyed_mutation)`), which an encoding through prost-types would drop.
/// `grpc_safe_retries/v1/options.proto` resolves to the option's definition bundled here when no
/// include directory has it, so a service's .proto can import it without vendoring it.
fn compile(protos: &[PathBuf], includes: &[PathBuf]) -> Result<Vec<u8>, protox::Error> {
    use protox::file::{ChainFileResolver, GoogleFileResolver, IncludeFileResolver};
    let mut resolver = ChainFileResolver::new();
    for include in includes {
        resolver.add(IncludeFileResolver::new(include.clone()));
    }
    resolver.add(GoogleFileResolver::new());
    resolver.add(BundledOption);
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler.open_files(protos)?;
    Ok(compiler.encode_file_descriptor_set())
}

/// Serves the keyed-mutation option's `.proto` by its import name.
struct BundledOption;

impl protox::file::FileResolver for BundledOption {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        const NAME: &str = "grpc_safe_retries/v1/options.proto";
        if name == NAME {
            protox::file::File::from_source(NAME, grpc_policy::KEYED_MUTATION_OPTION_PROTO)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}
