//! The adapter author's guide (`docs/adapters.md`) names every rule and every case: a case or a
//! rule added without a word in the guide fails here.

use grpc_ledger_contract_tests::{CASES, Rule};

fn guide() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/adapters.md");
    std::fs::read_to_string(path).expect("docs/adapters.md")
}

#[test]
fn the_guide_names_every_rule_and_every_case() {
    let guide = guide();
    for rule in Rule::ALL {
        assert!(
            guide.contains(&format!("`{}`", rule.name())),
            "docs/adapters.md does not name rule `{}`",
            rule.name()
        );
    }
    for case in CASES {
        assert!(
            guide.contains(&format!("`{case}`")),
            "docs/adapters.md does not name case `{case}`"
        );
    }
}
