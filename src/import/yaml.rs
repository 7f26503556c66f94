//! The YAML `qc-operator import` prints: an ordered tree of the fields it sets, each with the comments
//! a reader needs (placeholders, provenance), written out by hand since serde's emitters keep neither
//! the order nor the comments. The text is parsed back before it is printed (see `keda::finish`).

use serde_json::Value;

/// A value: a map in the order it is written, or a scalar.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Map(Vec<Entry>),
    /// A string, quoted when YAML could read it as anything else.
    Str(String),
    /// A duration or other text known to be a plain scalar of this crate's grammar (`30s`, `5m`).
    Plain(String),
    Int(i64),
    Bool(bool),
}

/// One line (or block) of a map.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Field {
        key: String,
        value: Node,
        /// Comment lines written just above the key.
        comment: Vec<String>,
        /// A short comment at the end of the key's line, e.g. where the value came from.
        trailing: Option<String>,
    },
    /// Comment lines on their own, e.g. a field the user must add.
    Comment(Vec<String>),
}

impl Node {
    pub fn map() -> Node {
        Node::Map(Vec::new())
    }

    pub fn str(s: impl Into<String>) -> Node {
        Node::Str(s.into())
    }

    /// Append `key: value` (to a map; a scalar is left as it is).
    pub fn field(self, key: &str, value: Node) -> Node {
        self.field_with(key, value, Vec::new())
    }

    /// Append `key: value` with comment lines above it.
    pub fn field_with(self, key: &str, value: Node, comment: Vec<String>) -> Node {
        self.push(key, value, comment, None)
    }

    /// Append `key: value  # from`: where the value came from, at the end of its line.
    pub fn field_from(self, key: &str, value: Node, from: impl Into<String>) -> Node {
        self.push(key, value, Vec::new(), Some(from.into()))
    }

    fn push(
        mut self,
        key: &str,
        value: Node,
        comment: Vec<String>,
        trailing: Option<String>,
    ) -> Node {
        if let Node::Map(entries) = &mut self {
            entries.push(Entry::Field {
                key: key.to_string(),
                value,
                comment,
                trailing,
            });
        }
        self
    }

    /// Append comment lines on their own.
    pub fn comment(mut self, lines: Vec<String>) -> Node {
        if let Node::Map(entries) = &mut self
            && !lines.is_empty()
        {
            entries.push(Entry::Comment(lines));
        }
        self
    }

    /// Whether the map holds no field (comments alone do not count).
    pub fn is_empty_map(&self) -> bool {
        match self {
            Node::Map(entries) => !entries.iter().any(|e| matches!(e, Entry::Field { .. })),
            _ => false,
        }
    }

    /// The data without the comments, as a YAML parser reads the text back.
    pub fn to_json(&self) -> Value {
        match self {
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Field { key, value, .. } => Some((key.clone(), value.to_json())),
                        Entry::Comment(_) => None,
                    })
                    .collect(),
            ),
            Node::Str(s) | Node::Plain(s) => Value::String(s.clone()),
            Node::Int(i) => Value::from(*i),
            Node::Bool(b) => Value::Bool(*b),
        }
    }

    /// The map as a YAML block (a document's body: keys at column 0).
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        if let Node::Map(entries) = self {
            write_entries(entries, 0, &mut out);
        }
        out
    }
}

/// Comment lines are wrapped within this width (indentation included).
pub const WIDTH: usize = 100;

/// `# ` lines: each line of text wrapped at spaces within [`WIDTH`], except a line that starts with a
/// space (a command or YAML to copy, kept whole).
pub fn write_comment(lines: &[String], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for line in lines.iter().flat_map(|l| l.split('\n')) {
        let line = line.trim_end();
        if line.is_empty() {
            out.push_str(&format!("{pad}#\n"));
            continue;
        }
        if line.starts_with(' ') {
            out.push_str(&format!("{pad}# {line}\n"));
            continue;
        }
        let width = WIDTH.saturating_sub(indent + 2).max(40);
        let mut current = String::new();
        for word in line.split(' ') {
            if !current.is_empty() && current.len() + 1 + word.len() > width {
                out.push_str(&format!("{pad}# {current}\n"));
                current.clear();
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push_str(&format!("{pad}# {current}\n"));
    }
}

fn write_entries(entries: &[Entry], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for entry in entries {
        match entry {
            Entry::Comment(lines) => write_comment(lines, indent, out),
            Entry::Field {
                key,
                value,
                comment,
                trailing,
            } => {
                write_comment(comment, indent, out);
                let key = scalar(key);
                let line = match value {
                    Node::Map(_) if !value.is_empty_map() => format!("{pad}{key}:"),
                    Node::Map(_) => format!("{pad}{key}: {{}}"),
                    Node::Str(s) => format!("{pad}{key}: {}", scalar(s)),
                    Node::Plain(s) => format!("{pad}{key}: {s}"),
                    Node::Int(i) => format!("{pad}{key}: {i}"),
                    Node::Bool(b) => format!("{pad}{key}: {b}"),
                };
                out.push_str(&line);
                if let Some(t) = trailing {
                    // one line: a line break would end the comment and start YAML
                    out.push_str("  # ");
                    out.push_str(&t.replace(['\n', '\r'], " "));
                }
                out.push('\n');
                if let Node::Map(inner) = value {
                    write_entries(inner, indent + 2, out);
                }
            }
        }
    }
}

/// Words YAML 1.1 (what kubectl's parser follows) or 1.2 reads as a boolean or null.
const RESERVED: &[&str] = &[
    "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~",
];

/// A string as a YAML scalar: plain when it starts with a letter (or `/`, a path), holds only characters that
/// cannot start a YAML construct and is no reserved word; otherwise double-quoted (a JSON string is
/// a YAML double-quoted scalar, escapes included).
pub fn scalar(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | ':' | '-'))
        && !s.ends_with(':')
        && !RESERVED.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_is_plain_only_where_yaml_reads_it_back_as_that_string() {
        for (s, want) in [
            ("orders", "orders"),
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
            ),
            (
                "arn:aws:iam::123456789012:role/keda",
                "arn:aws:iam::123456789012:role/keda",
            ),
            ("apps/v1", "apps/v1"),
            ("/messages", "/messages"),
            ("", "\"\""),
            ("123", "\"123\""),
            ("1e5", "\"1e5\""),
            ("on", "\"on\""),
            ("No", "\"No\""),
            ("a: b", "\"a: b\""),
            ("key:", "\"key:\""),
            ("#x", "\"#x\""),
            ("x #y", "\"x #y\""),
            ("role/a+b=c,d@e", "\"role/a+b=c,d@e\""),
            ("line\nbreak", "\"line\\nbreak\""),
        ] {
            assert_eq!(scalar(s), want, "{s:?}");
        }
    }

    #[test]
    fn every_scalar_reads_back_as_written() {
        let strings = [
            "orders",
            "",
            "123",
            "1e5",
            "on",
            "No",
            "a: b",
            "key:",
            "#x",
            "x #y",
            "null",
            "~",
            "'quoted'",
            "\"dq\"",
            "tab\there",
            "ünï",
            "- dash",
            "[x]",
            "{x}",
            "*x",
            "&x",
            "!x",
            "%x",
            "@x",
            "`x",
            "|x",
            ">x",
            "0x1F",
            "1:30",
        ];
        let mut node = Node::map();
        for (i, s) in strings.iter().enumerate() {
            node = node.field(&format!("k{i}"), Node::str(*s));
        }
        let text = node.to_yaml();
        let back: Value = serde_saphyr::from_str(&text).expect("parses");
        assert_eq!(back, node.to_json(), "{text}");
    }

    #[test]
    fn comments_wrap_at_spaces_within_the_width_but_keep_indented_lines_whole() {
        let long = "word ".repeat(30);
        let command = format!("  kubectl {}", "x".repeat(120));
        let mut out = String::new();
        write_comment(&[long.clone(), command.clone()], 4, &mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() == 3, "{out}");
        assert!(
            lines
                .iter()
                .take(2)
                .all(|l| l.len() <= WIDTH && l.starts_with("    # word")),
            "{out}"
        );
        assert_eq!(lines[2], format!("    # {command}"));
        let words: Vec<&str> = lines[..2].iter().flat_map(|l| l[6..].split(' ')).collect();
        assert_eq!(words.len(), 30);
    }

    #[test]
    fn maps_nest_by_two_spaces_with_comments_above_their_keys() {
        let node = Node::map().field("kind", Node::str("QueueConsumer")).field(
            "spec",
            Node::map()
                .comment(vec!["set aws.roleArn".into()])
                .field_with(
                    "processing",
                    Node::map().field("p99", Node::Plain("30s".into())),
                    vec!["first line".into(), String::new(), "third".into()],
                )
                .field_from("suspend", Node::Bool(true), "paused")
                .field("scaling", Node::map().field("maxReplicas", Node::Int(100))),
        );
        assert_eq!(
            node.to_yaml(),
            "kind: QueueConsumer\n\
             spec:\n  \
               # set aws.roleArn\n  \
               # first line\n  \
               #\n  \
               # third\n  \
               processing:\n    \
                 p99: 30s\n  \
               suspend: true  # paused\n  \
               scaling:\n    \
                 maxReplicas: 100\n"
        );
        assert_eq!(
            node.to_json(),
            serde_json::json!({"kind": "QueueConsumer", "spec": {"processing": {"p99": "30s"}, "suspend": true, "scaling": {"maxReplicas": 100}}})
        );
    }
}
