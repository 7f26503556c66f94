//! `qc-operator simulate` as a user runs it: the real binary, files on disk, exit codes and output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SPEC: &str = include_str!("../benches/scaling/spec.yaml");

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// Ten minutes: a quiet start, 20/s for five minutes, quiet.
fn small_trace() -> String {
    let mut csv = String::from("second,arrivals\n");
    for s in 60..360 {
        csv.push_str(&format!("{s},20\n"));
    }
    csv.push_str("599,0\n");
    csv
}

#[test]
fn text_output_is_a_table_with_every_policy_and_the_goal_checks() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "spec.yaml", SPEC);
    let trace = write(dir.path(), "ramp.csv", &small_trace());
    let out = simulate(&[
        "--spec",
        spec.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| trace | policy | replica-seconds |"),
        "{stdout}"
    );
    for policy in ["| ramp | ours |", "| ramp | keda |", "| ramp | oracle |"] {
        assert!(stdout.contains(policy), "{policy}: {stdout}");
    }
    assert!(stdout.contains("- ramp: ours/oracle"), "{stdout}");
    assert!(stdout.contains("start-up 30s"), "{stdout}");
    // each row's P99 dwell (arrival to deletion), a number of seconds, beside its P99 wait
    assert!(stdout.contains("| max wait | P99 dwell |"), "{stdout}");
    let ours = stdout
        .lines()
        .find(|l| l.starts_with("| ramp | ours |"))
        .expect("the ours row");
    let cells: Vec<&str> = ours.split('|').map(str::trim).collect();
    let secs = |c: &str| c.trim_end_matches('s').parse::<f64>().expect(c);
    assert!(
        secs(cells[7]) >= secs(cells[5]),
        "a dwell is a wait plus its handling: {ours}"
    );
    // no objective in this spec: no objective line
    assert!(!stdout.contains("objective: dwellP99"), "{stdout}");
}

#[test]
fn json_output_has_the_documented_keys_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "spec.yaml", SPEC);
    let trace = write(dir.path(), "ramp.csv", &small_trace());
    let out = simulate(&[
        "--spec",
        spec.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "ours",
        "--policy",
        "keda",
        "--startup",
        "10s",
        "--output",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, policy) in rows.iter().zip(["ours", "keda"]) {
        assert_eq!(row["policy"], policy);
        assert_eq!(row["trace"], "ramp");
        for key in [
            "replicaSeconds",
            "p99WaitSeconds",
            "maxWaitSeconds",
            "overTargetShare",
            "scaleEvents",
        ] {
            assert!(row[key].is_number(), "{key} in {row}");
        }
        assert_eq!(row["messages"], 6000);
        assert_eq!(row["unserved"], 0);
    }
}

#[test]
fn a_bad_trace_exits_2_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "spec.yaml", SPEC);
    let trace = write(dir.path(), "bad.csv", "second,arrivals\n0,1\n1,lots\n");
    let out = simulate(&[
        "--spec",
        spec.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.csv") && err.contains("line 3") && err.contains("lots"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_bad_spec_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.csv", &small_trace());
    let cases = [
        (
            SPEC.replace("minReplicas: 0", "minReplicas: 40"),
            "minReplicas must not exceed",
        ),
        (SPEC.replace("    p99: 2s\n", ""), "p99"),
        (
            SPEC.replace("mean: 800ms", "mean: 3s"),
            "spec.processing.mean",
        ),
        (
            SPEC.replace("concurrency: 10", "concurrency: ten"),
            "concurrency",
        ),
        (
            SPEC.replace("maxBacklogAge: 60s", "maxBacklogAge: 1 minute"),
            "duration",
        ),
    ];
    for (i, (yaml, needle)) in cases.iter().enumerate() {
        let spec = write(dir.path(), &format!("spec{i}.yaml"), yaml);
        let out = simulate(&[
            "--spec",
            spec.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{needle}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{needle}: {err}");
        assert!(err.contains(&format!("spec{i}.yaml")), "{err}");
    }
    let out = simulate(&[
        "--spec",
        "/nonexistent/spec.yaml",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/spec.yaml"));
}
