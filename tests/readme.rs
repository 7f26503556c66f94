//! The README stays a short, true front page: every figure it quotes is one the benchmark pages
//! hold, it stays under its length, and every relative link in it leads somewhere.
//!
//! A figure is a number with a unit or a ratio (`116.4 µs`, `20.5-22.7 MiB`, `85 %`, `0.11×`,
//! `0.2 requests per message`) in the README's prose; code blocks, code spans and link targets are
//! left out (a YAML `p99: 2s` is an example, not a claim). A figure with a unit symbol must appear
//! with that unit in docs/benchmarks.md or docs/scaling.md (a range as that range, or its two ends as
//! figures of their own; a range's end alone is not a figure of the docs); one with
//! a word unit (`requests per message`, `events/min`) must appear there as a number, since the tables
//! put the unit in the column's header.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The pages the README's figures must come from.
const FIGURE_SOURCES: &[&str] = &["docs/benchmarks.md", "docs/scaling.md"];

/// The README's limit: a newcomer's page, details in docs/.
const MAX_README_LINES: usize = 160;

/// Units written as symbols: the figure must appear with its unit.
const SYMBOL_UNITS: &[&str] = &[
    "µs", "us", "ms", "s", "min", "h", "MiB", "GiB", "KiB", "%", "x",
];

/// Units written as words, which the docs' tables keep in their headers: the number must appear.
const WORD_UNITS: &[&str] = &[
    "SQS requests per message",
    "requests per message",
    "SQS requests / msg",
    "requests / msg",
    "requests/msg",
    "msg/s",
    "messages/s",
    "messages per second",
    "events/min",
    "scale events per minute",
    "scale events",
    "replica-seconds",
];

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Thin and no-break spaces are spaces, every dash is a hyphen, `×` is `x`.
fn normalize(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{2009}' | '\u{202f}' | '\u{a0}' => ' ',
            '\u{2212}' | '\u{2013}' | '\u{2014}' => '-',
            '×' => 'x',
            c => c,
        })
        .collect()
}

/// The lines of a page outside its fenced code blocks (the fences themselves left out).
fn outside_fences(markdown: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    markdown.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The text a reader takes as claims: no fenced code blocks, no code spans, no link targets.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    for line in outside_fences(markdown) {
        let mut rest = line;
        let mut kept = String::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('`') {
                rest = after.find('`').map_or("", |end| &after[end + 1..]);
            } else if let Some(after) = rest.strip_prefix("](") {
                kept.push(']');
                rest = after.find(')').map_or("", |end| &after[end + 1..]);
            } else {
                let c = rest.chars().next().expect("not empty");
                kept.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Figure {
    /// One number, or the two ends of a range.
    numbers: Vec<String>,
    unit: String,
    /// As written, for the failure message.
    text: String,
}

/// A number at the start of `s`: digits, thousands separators, one decimal part.
fn number_at(s: &str) -> Option<&str> {
    let bytes = s.as_bytes();
    let mut end = 0;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    if end == 0 {
        return None;
    }
    loop {
        let sep = bytes.get(end).copied();
        let digits = bytes[end.saturating_add(1)..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        match sep {
            Some(b',') if digits == 3 => end += 4,
            Some(b'.') if digits > 0 => {
                end += 1 + digits;
                break;
            }
            _ => break,
        }
    }
    Some(&s[..end])
}

/// The unit right after a number (one optional space), if it is one of ours and ends a word.
fn unit_at(s: &str) -> Option<&'static str> {
    let s = s.strip_prefix(' ').unwrap_or(s);
    let mut units: Vec<&'static str> = SYMBOL_UNITS.iter().chain(WORD_UNITS).copied().collect();
    units.sort_by_key(|u| std::cmp::Reverse(u.len()));
    units.into_iter().find(|u| {
        s.starts_with(u)
            && !s[u.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// How many spaces `s` starts with.
fn spaces(s: &str) -> usize {
    s.len() - s.trim_start_matches(' ').len()
}

/// Every figure of a (normalized) text, and every number in it.
fn figures(text: &str) -> (Vec<Figure>, BTreeSet<String>) {
    let mut found = Vec::new();
    let mut numbers = BTreeSet::new();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let starts_word = text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '.' || c == '_'));
        let Some(first) = number_at(rest).filter(|_| starts_word) else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        numbers.insert(first.to_owned());
        let mut end = first.len();
        let mut ends = vec![first.to_owned()];
        // A range: `20.5-22.7`, `58 - 85`.
        let dash = end + spaces(&rest[end..]);
        if let Some(after_dash) = rest[dash..].strip_prefix('-') {
            let start = dash + 1 + spaces(after_dash);
            if let Some(second) = number_at(&rest[start..]) {
                numbers.insert(second.to_owned());
                ends.push(second.to_owned());
                end = start + second.len();
            }
        }
        if let Some(unit) = unit_at(&rest[end..]) {
            let unit_end = end + spaces(&rest[end..]).min(1);
            found.push(Figure {
                numbers: ends,
                unit: unit.to_owned(),
                text: rest[..unit_end + unit.len()].to_owned(),
            });
            i += unit_end + unit.len();
        } else {
            i += end;
        }
    }
    (found, numbers)
}

/// The README's figures that the sources do not hold.
fn unsourced(readme: &str, sources: &[String]) -> Vec<String> {
    // (numbers, unit): one number, or a range's two ends.
    let mut with_unit = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for source in sources {
        let (figs, nums) = figures(&normalize(source));
        with_unit.extend(figs.into_iter().map(|f| (f.numbers, f.unit)));
        numbers.extend(nums);
    }
    let (quoted, _) = figures(&normalize(&prose(readme)));
    let mut missing = Vec::new();
    for f in quoted {
        let ok = if SYMBOL_UNITS.contains(&f.unit.as_str()) {
            // The same figure, or a range whose two ends the docs quote on their own; never one
            // end of a range of the docs taken alone.
            with_unit.contains(&(f.numbers.clone(), f.unit.clone()))
                || (f.numbers.len() == 2
                    && f.numbers
                        .iter()
                        .all(|n| with_unit.contains(&(vec![n.clone()], f.unit.clone()))))
        } else {
            f.numbers.iter().all(|n| numbers.contains(n))
        };
        if !ok {
            missing.push(f.text);
        }
    }
    missing
}

#[test]
fn every_figure_the_readme_quotes_is_in_the_benchmark_or_scaling_docs() {
    let sources: Vec<String> = FIGURE_SOURCES.iter().map(|p| read(p)).collect();
    let readme = read("README.md");
    let (quoted, _) = figures(&normalize(&prose(&readme)));
    assert!(
        quoted.len() >= 3,
        "the scanner found almost no figure in README.md ({quoted:?}): is it still reading it?"
    );
    let missing = unsourced(&readme, &sources);
    assert!(
        missing.is_empty(),
        "README.md quotes figures that neither {FIGURE_SOURCES:?} holds: {missing:?}; quote the \
         latest tables of those pages, or add the measurement there first"
    );
}

#[test]
fn the_figure_check_catches_a_figure_the_docs_do_not_hold() {
    let sources = vec![normalize(
        "| goal | result |\n| CPU | met: 0.11× (116.4 against 1,059.2 µs); 116.4 µs here |\n\
         | RSS | 20.5-22.7 MiB; −85 % and −58 %, 55-95 % |\n| requests | 0.209 (every receive held 10) |\n",
    )];
    // Taken as written, with other spacing, dashes and signs: found.
    for good in [
        "0.11 × its CPU",
        "0.11x its CPU",
        "116.4 µs per message",
        "1,059.2\u{2009}µs",
        "20.5–22.7 MiB resident",
        "85 % fewer",
        "58–85 % fewer",
        "0.209 requests per message",
        "a `p99: 2s` in code and [a link](docs/x.md#run-12-ms) are not figures",
    ] {
        assert_eq!(unsourced(good, &sources), Vec::<String>::new(), "{good}");
    }
    // Made up, or with another unit: named.
    for (bad, named) in [
        ("0.12× its CPU", "0.12x"),
        ("116 µs per message", "116 µs"),
        ("116.4 ms per message", "116.4 ms"),
        ("20.5-23 MiB resident", "20.5-23 MiB"),
        ("57 % fewer", "57 %"),
        ("55 % fewer", "55 %"),
        ("55–85 % fewer", "55-85 %"),
        ("20.5 MiB resident", "20.5 MiB"),
        ("0.2 requests per message", "0.2 requests per message"),
        ("drains 3.6× faster", "3.6x"),
    ] {
        assert_eq!(unsourced(bad, &sources), vec![named.to_owned()], "{bad}");
    }
}

#[test]
fn the_readme_stays_a_front_page() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= MAX_README_LINES,
        "README.md has {lines} lines, more than {MAX_README_LINES}: move the detail into docs/ and link it"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens; a repeated
/// heading gets `-1`, `-2`, ...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in outside_fences(markdown) {
        let Some(title) = line
            .strip_prefix('#')
            .map(|t| t.trim_start_matches('#'))
            .and_then(|t| t.strip_prefix(' '))
        else {
            continue;
        };
        // The rendered text: code spans keep their text, links their text only.
        let mut title = title.to_owned();
        while let Some(start) = title.find("](") {
            let end = title[start..]
                .find(')')
                .map_or(title.len(), |e| start + e + 1);
            title.replace_range(start + 1..end, "");
        }
        let title = title.replace(['[', ']', '`'], "");
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links of a page's prose and tables (not of its code blocks).
fn link_targets(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(markdown) {
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// The relative links of one page (relative to its own directory) that lead to no file, or to no
/// heading of a Markdown file.
fn broken_links(root: &Path, page: &str) -> Vec<String> {
    let text = read(page);
    let dir = Path::new(page).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let file = if path.is_empty() {
            root.join(page)
        } else {
            root.join(dir).join(path)
        };
        if !file.exists() {
            broken.push(format!("{page}: {target}: no such file"));
            continue;
        }
        if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") {
            let linked = std::fs::read_to_string(&file).unwrap_or_default();
            if !anchors(&linked).contains(anchor) {
                broken.push(format!(
                    "{page}: {target}: no heading with the anchor #{anchor}"
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_leads_to_a_file_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let targets = link_targets(&read("README.md"));
    assert!(
        targets.len() >= 5,
        "few links found in README.md: {targets:?}"
    );
    let broken = broken_links(root, "README.md");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// What moved out of the README moved into docs/ with its links: they must lead somewhere too.
#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| format!("docs/{}", p.file_name().expect("name").to_string_lossy()))
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "docs/ pages: {pages:?}");
    let broken: Vec<String> = pages.iter().flat_map(|p| broken_links(root, p)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let page = "# Top\n## Batch mode (`handler.batch`)\n### Reference run: quiet, main 2fc284f (issue #12)\n\
                ```sh\n# not a heading\n```\n## Top\n## When the handler's dependency fails\n";
    let got = anchors(page);
    for want in [
        "top",
        "top-1",
        "batch-mode-handlerbatch",
        "reference-run-quiet-main-2fc284f-issue-12",
        "when-the-handlers-dependency-fails",
    ] {
        assert!(got.contains(want), "{want} not in {got:?}");
    }
    assert!(!got.contains("not-a-heading"), "{got:?}");
}

/// The README's QueueConsumer is one the API accepts: `qc-operator check` (schema and CEL rules,
/// client-side) finds it valid and without an Error finding.
#[test]
fn the_readmes_queueconsumer_is_valid() {
    let readme = read("README.md");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```yaml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    let manifests: Vec<&String> = blocks
        .iter()
        .filter(|b| b.contains("kind: QueueConsumer"))
        .collect();
    assert_eq!(
        manifests.len(),
        1,
        "one QueueConsumer in README.md: {blocks:?}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("readme.yaml");
    std::fs::write(&file, manifests[0]).expect("write manifest");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .arg("check")
        .arg(&file)
        .output()
        .expect("run qc-operator check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "qc-operator check refuses the README's QueueConsumer:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 QueueConsumer(s) checked: 0 error(s)"),
        "{stdout}"
    );
}
