//! From a finding's JSON path (`$.methodConfig[0].name[1]`) to a line and column in the file it
//! came from, so that editors and CI annotations point at the value.

/// The 1-based line and column (in characters) of the value at `path` in `text`: the member's
/// key for an object member, the element itself for an array element, the whole document for
/// `$`. Keys match exactly, else ignoring case (the reader accepts case variants). `None` when the
/// path is not in the text.
pub(crate) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let offset = find(text.as_bytes(), &segments(path)?)?;
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    Some((line, column))
}

#[derive(Debug, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

fn segments(path: &str) -> Option<Vec<Segment>> {
    let mut rest = path.strip_prefix('$')?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            out.push(Segment::Key(after[..end].to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            out.push(Segment::Index(after[..end].parse().ok()?));
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(out)
}

/// The byte offset of the value at `path`.
fn find(bytes: &[u8], path: &[Segment]) -> Option<usize> {
    let mut scan = Scanner { bytes, pos: 0 };
    scan.skip_space();
    let mut found = scan.pos;
    for segment in path {
        scan.skip_space();
        match segment {
            Segment::Key(key) => {
                scan.expect(b'{')?;
                loop {
                    scan.skip_space();
                    if scan.peek()? == b'}' {
                        return None;
                    }
                    let key_start = scan.pos;
                    let name = scan.string()?;
                    scan.skip_space();
                    scan.expect(b':')?;
                    scan.skip_space();
                    if name == *key || name.eq_ignore_ascii_case(key) {
                        found = key_start;
                        break;
                    }
                    scan.skip_value()?;
                    scan.skip_space();
                    if scan.peek()? == b',' {
                        scan.pos += 1;
                    }
                }
            }
            Segment::Index(index) => {
                scan.expect(b'[')?;
                for _ in 0..*index {
                    scan.skip_space();
                    scan.skip_value()?;
                    scan.skip_space();
                    scan.expect(b',')?;
                }
                scan.skip_space();
                found = scan.pos;
            }
        }
    }
    Some(found)
}

struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    /// A string's contents (escapes kept as written: keys of service configs have none).
    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let start = self.pos;
        loop {
            match self.peek()? {
                b'\\' => self.pos += 2,
                b'"' => break,
                _ => self.pos += 1,
            }
        }
        let text = String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned();
        self.pos += 1;
        Some(text)
    }

    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.pos += 1;
                loop {
                    self.skip_space();
                    if self.peek()? == close {
                        self.pos += 1;
                        return Some(());
                    }
                    if open == b'{' {
                        self.string()?;
                        self.skip_space();
                        self.expect(b':')?;
                        self.skip_space();
                    }
                    self.skip_value()?;
                    self.skip_space();
                    if self.peek()? == b',' {
                        self.pos += 1;
                    }
                }
            }
            _ => {
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.pos += 1;
                }
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{
  "methodConfig": [
    {"name": [{"service": "a.B"}, {"service": "c.D", "method": " M"}],
     "retrypolicy": {"maxAttempts": 3}},
    {
      "name": [{}]
    }
  ],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}"#;

    #[test]
    fn paths_point_at_their_values() {
        let cases = [
            ("$", (1, 1)),
            ("$.methodConfig", (2, 3)),
            ("$.methodConfig[0]", (3, 5)),
            ("$.methodConfig[0].name[1]", (3, 35)),
            ("$.methodConfig[0].name[1].method", (3, 54)),
            ("$.methodConfig[0].retryPolicy.maxAttempts", (4, 22)),
            ("$.methodConfig[1].name", (6, 7)),
            ("$.retryThrottling.tokenRatio", (9, 40)),
        ];
        for (path, expected) in cases {
            assert_eq!(locate(TEXT, path), Some(expected), "{path}");
        }
        assert_eq!(locate(TEXT, "$.methodConfig[5]"), None);
        assert_eq!(locate(TEXT, "$.nothing"), None);
        assert_eq!(locate(TEXT, "not a path"), None);
    }
}
