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

/// A heading's text as GitHub renders it: code spans keep their text, links their text only, emphasis
/// markers and a closing run of `#` go.
fn heading_text(title: &str) -> String {
    let mut title = title.trim().to_owned();
    // A closing sequence: `## Title ##` is "Title" (a `#` glued to a word stays).
    let trimmed = title.trim_end_matches('#');
    if trimmed.len() < title.len() && (trimmed.is_empty() || trimmed.ends_with(' ')) {
        title = trimmed.trim_end().to_owned();
    }
    while let Some(start) = title.find("](") {
        let end = title[start..]
            .find(')')
            .map_or(title.len(), |e| start + e + 1);
        title.replace_range(start + 1..end, "");
    }
    title.replace(['[', ']', '`', '*'], "")
}

/// GitHub's anchor for a heading: lower case; letters, digits, `-` and `_` kept, every space a hyphen,
/// all else dropped; a repeated heading gets `-1`, `-2`, ...; explicit `<a id="...">` or `name="..."`
/// anchors count too.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in outside_fences(markdown) {
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find("<a ") {
                let tag = &rest[at..rest[at..].find('>').map_or(rest.len(), |e| at + e)];
                if let Some(v) = tag.find(attr).map(|i| &tag[i + attr.len()..])
                    && let Some(end) = v.find('"')
                {
                    out.insert(v[..end].to_owned());
                }
                rest = &rest[at + 3..];
            }
        }
        let Some(title) = line
            .strip_prefix('#')
            .map(|t| t.trim_start_matches('#'))
            .and_then(|t| t.strip_prefix(' '))
        else {
            continue;
        };
        let slug: String = heading_text(title)
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

/// A line without its code spans: a `[text](target)` inside backticks is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        match after.find(fence) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of a page's links outside code: inline links and images (`[text](target "title")`,
/// `<target>` too) and reference definitions (`[label]: target`).
fn link_targets(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(markdown) {
        let line = without_code_spans(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains("](")
        {
            if let Some(target) = trimmed[close + 2..].split_whitespace().next() {
                out.push(target.trim_matches(['<', '>']).to_owned());
            }
            continue;
        }
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            // Balanced parentheses inside a target, as CommonMark allows.
            let mut depth = 0usize;
            let end = after
                .char_indices()
                .find(|&(_, c)| match c {
                    '(' => {
                        depth += 1;
                        false
                    }
                    ')' if depth == 0 => true,
                    ')' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .map_or(after.len(), |(i, _)| i);
            let inner = after[..end].trim();
            let target = if let Some(angled) = inner.strip_prefix('<') {
                angled.split('>').next().unwrap_or_default()
            } else {
                inner.split_whitespace().next().unwrap_or_default()
            };
            out.push(target.to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// `%20` and the like in a link, as the browser decodes it.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The relative links of one page (relative to its own directory) that lead to no file, or to no
/// heading of a Markdown file.
fn broken_links(root: &Path, page: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(root.join(page)).unwrap_or_else(|e| panic!("read {page}: {e}"));
    let dir = Path::new(page).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        if target.is_empty() {
            broken.push(format!("{page}: a link with no target"));
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let path = percent_decoded(path);
        let file = if path.is_empty() {
            root.join(page)
        } else if let Some(from_root) = path.strip_prefix('/') {
            root.join(from_root)
        } else {
            root.join(dir).join(&path)
        };
        if !file.exists() {
            broken.push(format!("{page}: {target}: no such file"));
            continue;
        }
        // A link must stay inside the repository: GitHub shows nothing above its root.
        let inside = file
            .canonicalize()
            .is_ok_and(|f| f.starts_with(root.canonicalize().expect("root")));
        if !inside {
            broken.push(format!("{page}: {target}: outside the repository"));
            continue;
        }
        if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") {
            let linked = std::fs::read_to_string(&file).unwrap_or_default();
            if !anchors(&linked).contains(&percent_decoded(anchor)) {
                broken.push(format!(
                    "{page}: {target}: no heading with the anchor #{anchor}"
                ));
            }
        }
    }
    broken
}

/// Every Markdown page of the repository a reader reaches: the root's (README, CONTRIBUTING, SECURITY,
/// CHANGELOG), docs/, and the chart's README.
fn pages(root: &Path) -> Vec<String> {
    let mut pages = Vec::new();
    for dir in ["", "docs", "charts/queue-consumer-operator"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                let name = path
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned();
                pages.push(if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                });
            }
        }
    }
    pages.sort();
    pages
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

/// What moved out of the README moved into docs/ with its links: they must lead somewhere too, and so
/// must those of the project's other pages.
#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = pages(root);
    for must in [
        "README.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "CHANGELOG.md",
        "docs/testing.md",
        "charts/queue-consumer-operator/README.md",
    ] {
        assert!(pages.iter().any(|p| p == must), "{must} not in {pages:?}");
    }
    assert!(pages.len() >= 20, "pages: {pages:?}");
    let broken: Vec<String> = pages.iter().flat_map(|p| broken_links(root, p)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The check finds what it is for: a missing file, a missing anchor, a link out of the repository; and
/// leaves alone a link in code, an absolute URL and a good one of each kind.
#[test]
fn the_link_check_finds_each_kind_of_broken_link() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("repo");
    std::fs::create_dir_all(root.join("docs")).expect("mkdir");
    std::fs::write(
        root.join("docs/b.md"),
        "# B page\n## Step 2: run it (`qc-operator run`) ##\n<a id=\"custom\"></a>\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("outside.md"), "# Outside\n").expect("write");
    let page = "[ok](docs/b.md#step-2-run-it-qc-operator-run) [ok](docs/b.md#custom) \
                [ok](<docs/b.md> \"title\") [ok](#a-page) [ok]: docs/b.md#b-page\n\
                `[code](docs/none.md)` [web](https://example.org/x.md#y)\n\
                # A page\n\
                [gone](docs/none.md) [anchor](docs/b.md#step-3) [up](../outside.md)\n\
                [ref]: docs/b.md#nowhere\n";
    std::fs::write(root.join("a.md"), page).expect("write");
    let broken = broken_links(&root, "a.md");
    assert_eq!(
        broken,
        vec![
            "a.md: docs/none.md: no such file",
            "a.md: docs/b.md#step-3: no heading with the anchor #step-3",
            "a.md: ../outside.md: outside the repository",
            "a.md: docs/b.md#nowhere: no heading with the anchor #nowhere",
        ],
        "{broken:#?}"
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let page = "# Top\n## Batch mode (`handler.batch`)\n### Reference run: quiet, main 2fc284f (issue #12)\n\
                ```sh\n# not a heading\n```\n## Top\n## When the handler's dependency fails\n\
                ## Closed heading ##\n## **Bold** and [a link](x.md)\n## 2a. Helm\n";
    let got = anchors(page);
    for want in [
        "top",
        "top-1",
        "batch-mode-handlerbatch",
        "reference-run-quiet-main-2fc284f-issue-12",
        "when-the-handlers-dependency-fails",
        "closed-heading",
        "bold-and-a-link",
        "2a-helm",
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
