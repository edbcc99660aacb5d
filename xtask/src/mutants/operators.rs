//! The SQL mutation operators: every way a statement can be subtly wrong, one change at a time.
//!
//! They read a statement's template (`$N` placeholders, the store's clock written out) as text,
//! with just enough structure to find conditions (after `WHERE` and `WHEN`, split on `AND` at
//! parenthesis depth 0), `SET` assignments and conflict clauses. Each mutant keeps every
//! parameter the statement binds referenced, so that it runs with the adapter's values unchanged:
//! a dropped condition becomes `(condition OR TRUE)` and a dropped assignment a no-op that still
//! reads its expression.

/// One mutant of a statement: what was changed, and the mutated template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mutant {
    /// What the mutation did, in the report's words (stable: the equivalence file names it).
    pub(crate) label: String,
    /// The statement with the mutation.
    pub(crate) template: String,
}

/// What ends a condition at parenthesis depth 0.
const ENDS: [&str; 8] = [
    " THEN ",
    " RETURNING ",
    " LIMIT ",
    " UNION ",
    " ORDER BY ",
    " GROUP BY ",
    " ON CONFLICT ",
    " FROM ",
];

/// The comparisons a flip swaps, longest first so that `<=` is never read as `<`.
const FLIPS: [(&str, &str); 6] = [
    (" <= ", " < "),
    (" >= ", " > "),
    (" <> ", " = "),
    (" < ", " <= "),
    (" > ", " >= "),
    (" = ", " <> "),
];

/// Every mutant of `template`; `limit_takes_expressions` says whether the dialect accepts an
/// expression in `LIMIT` (MariaDB takes a number or a placeholder only).
pub(crate) fn mutants(template: &str, limit_takes_expressions: bool) -> Vec<Mutant> {
    let mut mutants = Vec::new();
    for (start, end) in conditions(template) {
        let region = &template[start..end];
        for (from, to) in conjuncts(region) {
            let conjunct = &region[from..to];
            if conjunct.eq_ignore_ascii_case("true") {
                continue;
            }
            mutants.push(Mutant {
                label: format!("condition dropped: {conjunct}"),
                template: splice(
                    template,
                    start + from,
                    start + to,
                    &format!("({conjunct} OR TRUE)"),
                ),
            });
        }
        for (at, from, to) in comparisons(region) {
            let context = context_of(region, at, from.len());
            mutants.push(Mutant {
                label: format!(
                    "comparison flipped ({}→{}): {context}",
                    from.trim(),
                    to.trim()
                ),
                template: splice(template, start + at, start + at + from.len(), to),
            });
        }
    }
    for (start, end) in assignments(template) {
        let assignment = &template[start..end];
        let Some((column, expression)) = assignment.split_once(" = ") else {
            continue;
        };
        mutants.push(Mutant {
            label: format!("assignment dropped: {assignment}"),
            template: splice(
                template,
                start,
                end,
                &format!(
                    "{column} = CASE WHEN ({expression}) IS NULL THEN {column} ELSE {column} END"
                ),
            ),
        });
    }
    if let Some(at) = template.find("ON CONFLICT (") {
        let close = at + template[at..].find(" DO NOTHING").unwrap_or(0);
        if close > at {
            let clause = &template[at..close + " DO NOTHING".len()];
            mutants.push(Mutant {
                label: format!("conflict clause dropped: {clause}"),
                template: template
                    .replacen(&format!("{clause} "), "", 1)
                    .replacen(clause, "", 1),
            });
        }
    }
    if limit_takes_expressions {
        let mut from = 0;
        while let Some(at) = template[from..].find(" LIMIT $").map(|at| from + at) {
            let digits_start = at + " LIMIT $".len();
            let digits_end = digits_start
                + template[digits_start..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(template.len() - digits_start);
            let limit = &template[at + 1..digits_end];
            mutants.push(Mutant {
                label: format!("limit off by one: {limit} + 1"),
                template: splice(template, at + 1, digits_end, &format!("{limit} + 1")),
            });
            from = digits_end;
        }
    }
    let mut seen = std::collections::HashSet::new();
    mutants.retain(|mutant| seen.insert(mutant.template.clone()));
    // The same change in two places (a condition repeated in two `CASE WHEN`s) is two mutants:
    // the second and later are numbered, so that the report and the equivalence file can tell
    // them apart.
    let mut counts = std::collections::HashMap::new();
    for mutant in &mut mutants {
        let count = counts.entry(mutant.label.clone()).or_insert(0);
        *count += 1;
        if *count > 1 {
            mutant.label = format!("{} (occurrence {count})", mutant.label);
        }
    }
    mutants
}

/// `text` with `start..end` replaced by `with`.
fn splice(text: &str, start: usize, end: usize, with: &str) -> String {
    format!("{}{with}{}", &text[..start], &text[end..])
}

/// A few words around `at` in `region`, for a label.
fn context_of(region: &str, at: usize, len: usize) -> String {
    let before = region[..at].rsplit(' ').next().unwrap_or_default();
    let after = region[at + len..].split(' ').next().unwrap_or_default();
    format!("{before}{}{after}", &region[at..at + len])
}

/// The byte ranges of every condition: after `WHERE ` or `WHEN `, to the first end at depth 0
/// (a closing parenthesis of an enclosing group, a clause keyword, or the end).
fn conditions(template: &str) -> Vec<(usize, usize)> {
    let mut regions = Vec::new();
    for keyword in ["WHERE ", "WHEN "] {
        let mut from = 0;
        while let Some(found) = template[from..].find(keyword) {
            let start = from + found + keyword.len();
            from = start;
            let boundary = template[..start - keyword.len()]
                .chars()
                .next_back()
                .is_none_or(|c| c == ' ' || c == '(');
            if !boundary {
                continue;
            }
            regions.push((start, region_end(template, start)));
        }
    }
    regions.sort_unstable();
    regions
}

/// Where the condition that starts at `start` ends.
fn region_end(template: &str, start: usize) -> usize {
    let mut depth = 0i32;
    let mut in_quote = false;
    for (offset, c) in template[start..].char_indices() {
        let at = start + offset;
        match c {
            '\'' => in_quote = !in_quote,
            _ if in_quote => {}
            '(' => depth += 1,
            ')' if depth == 0 => return at,
            ')' => depth -= 1,
            _ if depth == 0 && ENDS.iter().any(|end| template[at..].starts_with(end)) => {
                return at;
            }
            _ => {}
        }
    }
    template.len()
}

/// The conjuncts of a condition (split on ` AND ` at depth 0), as ranges within it.
fn conjuncts(region: &str) -> Vec<(usize, usize)> {
    let mut parts = Vec::new();
    let (mut depth, mut in_quote, mut start) = (0i32, false, 0);
    for (at, c) in region.char_indices() {
        match c {
            '\'' => in_quote = !in_quote,
            _ if in_quote => {}
            '(' => depth += 1,
            ')' => depth -= 1,
            ' ' if depth == 0 && region[at..].starts_with(" AND ") => {
                parts.push((start, at));
                start = at + " AND ".len();
            }
            _ => {}
        }
    }
    parts.push((start, region.len()));
    parts
}

/// Every comparison operator of a condition at its depth 0 (a nested query's conditions are
/// regions of their own), outside quotes: its offset and its flip.
fn comparisons(region: &str) -> Vec<(usize, &'static str, &'static str)> {
    let mut found = Vec::new();
    let (mut in_quote, mut depth) = (false, 0i32);
    let mut at = 0;
    while at < region.len() {
        let c = region[at..].chars().next().unwrap_or(' ');
        if c == '\'' {
            in_quote = !in_quote;
        } else if !in_quote && c == '(' {
            depth += 1;
        } else if !in_quote && c == ')' {
            depth -= 1;
        } else if !in_quote
            && depth == 0
            && let Some((from, to)) = FLIPS
                .iter()
                .find(|(from, _)| region[at..].starts_with(from))
        {
            found.push((at, *from, *to));
            at += from.len() - 1;
            continue;
        }
        at += c.len_utf8();
    }
    found
}

/// The byte ranges of every `SET` assignment of an `UPDATE` (split on `, ` at depth 0, up to its
/// `WHERE`).
fn assignments(template: &str) -> Vec<(usize, usize)> {
    let Some(set) = template.find(" SET ") else {
        return Vec::new();
    };
    if !template.starts_with("UPDATE ") {
        return Vec::new();
    }
    let start = set + " SET ".len();
    let end = template[start..]
        .find(" WHERE ")
        .map_or(template.len(), |at| start + at);
    let mut parts = Vec::new();
    let (mut depth, mut part_start) = (0i32, start);
    for (offset, c) in template[start..end].char_indices() {
        let at = start + offset;
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push((part_start, at));
                part_start = at + ", ".len();
            }
            _ => {}
        }
    }
    parts.push((part_start, end));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(template: &str) -> Vec<String> {
        mutants(template, true)
            .into_iter()
            .map(|m| m.label)
            .collect()
    }

    #[test]
    fn a_transition_loses_each_condition_flips_each_comparison_and_drops_each_assignment() {
        let update = "UPDATE t SET state = 'DONE', version = version + 1 WHERE id = $1 AND \
                      state = 'OPEN' AND version = $2";
        let all = mutants(update, true);
        assert_eq!(
            labels(update),
            [
                "condition dropped: id = $1",
                "condition dropped: state = 'OPEN'",
                "condition dropped: version = $2",
                "comparison flipped (=→<>): id = $1",
                "comparison flipped (=→<>): state = 'OPEN'",
                "comparison flipped (=→<>): version = $2",
                "assignment dropped: state = 'DONE'",
                "assignment dropped: version = version + 1",
            ]
        );
        assert_eq!(
            all[1].template,
            "UPDATE t SET state = 'DONE', version = version + 1 WHERE id = $1 AND \
             (state = 'OPEN' OR TRUE) AND version = $2"
        );
        assert_eq!(
            all[7].template,
            "UPDATE t SET state = 'DONE', version = CASE WHEN (version + 1) IS NULL THEN version \
             ELSE version END WHERE id = $1 AND state = 'OPEN' AND version = $2"
        );
    }

    #[test]
    fn conditions_end_at_their_group_and_clauses_and_skip_quotes() {
        let select = "SELECT COUNT(CASE WHEN a <= $1 AND b = 'x AND y' THEN 1 END) FROM t \
                      WHERE c IN (SELECT c FROM u WHERE d < 2 LIMIT $2)";
        let all = labels(select);
        assert!(
            all.contains(&"condition dropped: a <= $1".to_owned()),
            "{all:?}"
        );
        assert!(
            all.contains(&"condition dropped: b = 'x AND y'".to_owned()),
            "{all:?}"
        );
        assert!(
            all.contains(&"condition dropped: d < 2".to_owned()),
            "{all:?}"
        );
        assert!(
            all.contains(&"comparison flipped (<=→<): a <= $1".to_owned()),
            "{all:?}"
        );
        assert!(
            all.contains(&"limit off by one: LIMIT $2 + 1".to_owned()),
            "{all:?}"
        );
        assert!(
            !mutants(select, false)
                .iter()
                .any(|m| m.label.starts_with("limit")),
            "MariaDB's LIMIT takes no expression"
        );
    }

    #[test]
    fn an_insert_loses_its_conflict_clause_and_keeps_where_true() {
        let insert = "INSERT INTO t (a) SELECT $1 FROM (SELECT 1 AS now) AS clock WHERE true \
                      ON CONFLICT (a) DO NOTHING RETURNING version";
        assert_eq!(
            labels(insert),
            ["conflict clause dropped: ON CONFLICT (a) DO NOTHING"]
        );
        assert_eq!(
            mutants(insert, true)[0].template,
            "INSERT INTO t (a) SELECT $1 FROM (SELECT 1 AS now) AS clock WHERE true RETURNING \
             version"
        );
    }

    #[test]
    fn the_same_change_in_two_places_is_numbered() {
        let select = "SELECT COUNT(CASE WHEN s = 1 THEN 1 END), COUNT(CASE WHEN s = 1 AND l < 2 \
                      THEN 1 END) FROM t";
        let all = labels(select);
        assert!(
            all.contains(&"condition dropped: s = 1".to_owned()),
            "{all:?}"
        );
        assert!(
            all.contains(&"condition dropped: s = 1 (occurrence 2)".to_owned()),
            "{all:?}"
        );
    }

    #[test]
    fn every_mutant_keeps_every_parameter() {
        let update = "UPDATE t SET a = $3, b = $4 WHERE id = $1 AND v = $2";
        for mutant in mutants(update, true) {
            for parameter in ["$1", "$2", "$3", "$4"] {
                assert!(mutant.template.contains(parameter), "{mutant:?}");
            }
        }
    }
}
