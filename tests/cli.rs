//! End-to-end tests of `aec check` on broken input: the real binary, run on the
//! variant files in `tests/cli_fixtures/` (one DSL error each), on files that
//! are not variant files at all, and on the `tests/ui/` macro cases (the CLI
//! must report the same message at the same place as the `attention!` macro).
//!
//! Expected lines and columns are computed from the fixture text by searching
//! for the offending token, so editing a fixture's layout does not break them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Exit code of `aec check` for problems in the user's input.
const EXIT_INPUT: i32 = 2;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `aec` from the package root (so relative paths print as given).
fn aec(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run the aec binary");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked") && !run.stdout.contains("panicked"),
        "aec {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

/// A fresh scratch directory for files written at test time.
fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// 1-based line and column (in characters, as the CLI counts them) of
/// `token` inside `context`, which must occur exactly once in `text`.
fn locate(text: &str, context: &str, token: &str) -> (usize, usize) {
    let hits: Vec<usize> = text.match_indices(context).map(|(i, _)| i).collect();
    assert_eq!(
        hits.len(),
        1,
        "context {context:?} must occur exactly once in the fixture"
    );
    let within = context
        .find(token)
        .unwrap_or_else(|| panic!("token {token:?} is not in context {context:?}"));
    let at = hits[0] + within;
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..at].chars().count() + 1;
    (line, col)
}

/// Asserts the rustc-style rendering: `path:line:col`, the source line under
/// its number, and a caret line whose first `^` sits under column `col` and
/// that is at least as wide as `token`.
fn assert_points_at(
    stderr: &str,
    source: &str,
    path: &str,
    (line, col): (usize, usize),
    token: &str,
) {
    let loc = format!("--> {path}:{line}:{col}");
    assert!(
        stderr.contains(&loc),
        "expected `{loc}` in stderr:\n{stderr}"
    );
    let text = source.lines().nth(line - 1).expect("line exists");
    let numbered = format!("{line} | {text}");
    let lines: Vec<&str> = stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == numbered)
        .unwrap_or_else(|| panic!("expected the source line `{numbered}` in stderr:\n{stderr}"));
    let caret_line = lines
        .get(at + 1)
        .unwrap_or_else(|| panic!("no caret line after the source line:\n{stderr}"));
    let gutter = " ".repeat(line.to_string().len());
    let marks = caret_line
        .strip_prefix(&format!("{gutter} | "))
        .unwrap_or_else(|| panic!("malformed caret line {caret_line:?}:\n{stderr}"));
    let lead: String = marks.chars().take_while(|c| *c != '^').collect();
    assert!(
        lead.chars().all(char::is_whitespace),
        "caret line {caret_line:?} has something other than whitespace before the caret"
    );
    assert_eq!(
        lead.chars().count() + 1,
        col,
        "caret is not under column {col}:\n{stderr}"
    );
    // Tabs before the caret are kept, so it lines up in a terminal too.
    let expected_lead: String = text
        .chars()
        .take(col - 1)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    assert_eq!(
        lead, expected_lead,
        "caret lead does not mirror the source line's tabs"
    );
    let width = marks
        .chars()
        .skip(lead.chars().count())
        .take_while(|c| *c == '^')
        .count();
    assert!(
        width >= token.chars().count(),
        "caret `{}` is narrower than the token {token:?}:\n{stderr}",
        "^".repeat(width)
    );
    assert!(
        col - 1 + width <= text.chars().count(),
        "caret runs past the end of the line:\n{stderr}"
    );
}

/// One broken fixture: where its error is, and what `aec check` must say.
struct Case {
    file: &'static str,
    /// A snippet that occurs once in the fixture and holds the offending token.
    context: &'static str,
    /// The offending token (its first occurrence in `context`).
    token: &'static str,
    message: &'static str,
    help: Option<&'static str>,
}

const CASES: &[Case] = &[
    Case {
        file: "unknown_function.rs",
        context: "/* ∂é→ */ expo(s - m)",
        token: "expo",
        message: "unknown function `expo`",
        help: Some("did you mean `exp`?"),
    },
    Case {
        file: "mask_arity.rs",
        context: "mask = |b, h, i| i >= 0",
        token: "|",
        message: "wrong closure arity: `mask` takes 4 parameter(s), found 3",
        help: Some("write it as `mask = |b, h, i, j| i >= j`"),
    },
    Case {
        file: "state_field_missing.rs",
        context: "(p, State { m }, exp(st.m - m))",
        token: "State",
        message: "state field `l` missing from `fwd`'s new state",
        help: Some("`fwd` must give every state field a new value: `State { m, l }`"),
    },
    Case {
        file: "axis_mismatch_k.rs",
        context: "k: [B, H, Skv, Dv]",
        token: "Dv",
        message: "axis mismatch: axis 4 of `k` must be `Dqk`, found `Dv` (expected [B, H, Skv, Dqk])",
        help: Some("k is multiplied with q, so its last axis is `Dqk`"),
    },
    Case {
        file: "custom_input_axis_mismatch.rs",
        context: "|s| s + bias",
        token: "bias",
        message: "axis mismatch: input `bias` varies over [Dv], which `modify_scores` does not iterate over",
        help: Some("declare the input with a subset of them"),
    },
    Case {
        file: "reduction_in_modify_scores.rs",
        context: "|s| s - rowmax(s)",
        token: "rowmax",
        message: "row reductions (`rowmax`) are only allowed in the online block's `fwd`; `modify_scores` is elementwise",
        help: Some("move the reduction into `online { fwd = |s, st| … }`"),
    },
    Case {
        file: "unknown_state_field.rs",
        context: "st.x - m",
        token: "x",
        message: "the state has no field `x`; it declares m, l",
        help: None,
    },
    Case {
        file: "boolean_as_number.rs",
        context: "s - (i >= j)",
        token: "(i >= j)",
        message: "expected a number, found a boolean",
        help: Some("use `select(cond, a, b)` to turn a condition into a number"),
    },
    Case {
        file: "unknown_pattern.rs",
        context: "Relu: paralel {",
        token: "paralel",
        message: "unknown pattern `paralel`; expected `parallel` or `recurrent`",
        help: Some("did you mean `parallel`?"),
    },
    Case {
        file: "pow_variable_exponent.rs",
        context: "), s);",
        token: "s",
        message: "the exponent of `pow` must be a constant",
        help: Some("for a variable exponent write `exp(y * log(x))`"),
    },
    Case {
        file: "epilogue_not_linear.rs",
        context: "|o, st| o * o / st.l",
        token: "o * o / st.l",
        message: "the epilogue's output must be linear in `o` (o times a function of the state)",
        help: Some("e.g. `o / st.l`"),
    },
    Case {
        file: "unknown_name.rs",
        context: "q * scale",
        token: "scale",
        message: "unknown name `scale`",
        help: None,
    },
    Case {
        file: "unknown_closure.rs",
        context: "modify_score = |s|",
        token: "modify_score",
        message: "unknown closure `modify_score` for the parallel pattern",
        help: Some("did you mean `modify_scores`?"),
    },
    Case {
        file: "missing_pattern_colon.rs",
        context: "struct Relu parallel {",
        token: "parallel",
        message: "expected `:` and the pattern after the variant name",
        help: None,
    },
];

#[test]
fn broken_fixtures_report_the_offending_token() {
    for case in CASES {
        let path = format!("tests/cli_fixtures/{}", case.file);
        let source = std::fs::read_to_string(root().join(&path)).expect("read fixture");
        let (line, col) = locate(&source, case.context, case.token);
        let run = aec(&["check", &path]);
        assert_eq!(
            run.code,
            Some(EXIT_INPUT),
            "{path}: expected exit code 2\n{}",
            run.stderr
        );
        let first = run.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains(case.message),
            "{path}: expected `error: {}` first, got:\n{}",
            case.message,
            run.stderr
        );
        assert_eq!(
            run.stderr.matches("error: ").count(),
            1,
            "{path}: expected exactly one error:\n{}",
            run.stderr
        );
        assert_points_at(&run.stderr, &source, &path, (line, col), case.token);
        if let Some(help) = case.help {
            let help_line = run
                .stderr
                .lines()
                .find(|l| l.trim_start().starts_with("= help: "))
                .unwrap_or_else(|| panic!("{path}: no help line:\n{}", run.stderr));
            assert!(
                help_line.contains(help),
                "{path}: expected help containing {help:?}, got {help_line:?}"
            );
        }
        assert!(
            run.stdout.is_empty(),
            "{path}: a broken variant prints nothing on stdout:\n{}",
            run.stdout
        );
    }
}

#[test]
fn every_fixture_is_covered() {
    let mut files: Vec<String> = std::fs::read_dir(root().join("tests/cli_fixtures"))
        .expect("read tests/cli_fixtures")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let covered: Vec<&str> = CASES
        .iter()
        .map(|c| c.file)
        .chain(["not_rust.rs", "no_attention.rs", "two_variants.rs"])
        .collect();
    for f in &files {
        assert!(
            covered.contains(&f.as_str()),
            "tests/cli_fixtures/{f} is not used by tests/cli.rs"
        );
    }
}

/// Asserts a clean input error: exit code 2, nothing on stdout, a first line
/// `error: …` containing `needle`, and at most `max_lines` lines in all.
fn assert_input_error(run: &Run, needle: &str, max_lines: usize) {
    assert_eq!(
        run.code,
        Some(EXIT_INPUT),
        "expected exit code 2:\n{}",
        run.stderr
    );
    assert!(
        run.stdout.is_empty(),
        "expected no stdout, got:\n{}",
        run.stdout
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        !lines.is_empty() && lines[0].starts_with("error: ") && lines[0].contains(needle),
        "expected `error: …{needle}…` as the first line, got:\n{}",
        run.stderr
    );
    assert!(
        lines.len() <= max_lines,
        "expected at most {max_lines} line(s), got:\n{}",
        run.stderr
    );
}

#[test]
fn missing_file() {
    let dir = scratch("missing");
    let path = dir.join("does_not_exist.rs");
    let shown = path.to_str().unwrap();
    let run = aec(&["check", shown]);
    assert_input_error(&run, "no such file", 1);
    assert!(
        run.stderr.contains(shown),
        "the message names the file:\n{}",
        run.stderr
    );
}

#[test]
fn directory() {
    let run = aec(&["check", "tests/cli_fixtures"]);
    assert_input_error(&run, "tests/cli_fixtures is a directory", 1);
}

#[test]
fn empty_and_blank_files() {
    let dir = scratch("empty");
    for (name, text) in [("empty.rs", ""), ("blank.rs", " \n\n\t\n")] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let run = aec(&["check", path.to_str().unwrap()]);
        assert_input_error(&run, "is empty", 1);
        assert!(
            run.stderr.contains(name),
            "the message names the file:\n{}",
            run.stderr
        );
    }
}

#[test]
fn non_utf8_file() {
    let dir = scratch("non-utf8");
    let path = dir.join("latin1.rs");
    // Valid Rust in Latin-1: the `é` is the single byte 0xE9.
    std::fs::write(&path, b"// caf\xe9\nfn main() {}\n").unwrap();
    let run = aec(&["check", path.to_str().unwrap()]);
    assert_input_error(&run, "is not UTF-8", 1);
    assert!(
        run.stderr.contains("latin1.rs"),
        "the message names the file:\n{}",
        run.stderr
    );
}

#[test]
fn file_without_attention() {
    let run = aec(&["check", "tests/cli_fixtures/no_attention.rs"]);
    // The error line and one help line.
    assert_input_error(
        &run,
        "no `attention! { … }` found in tests/cli_fixtures/no_attention.rs",
        2,
    );
}

#[test]
fn file_that_is_not_rust() {
    let path = "tests/cli_fixtures/not_rust.rs";
    let source = std::fs::read_to_string(root().join(path)).unwrap();
    let run = aec(&["check", path]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr.starts_with("error: expected an expression\n"),
        "expected syn's parse error first:\n{}",
        run.stderr
    );
    let at = locate(&source, "let x = ;", ";");
    assert_points_at(&run.stderr, &source, path, at, ";");
    assert!(
        run.stderr.contains("must be a Rust source file"),
        "expected a note on what a variant file is:\n{}",
        run.stderr
    );
}

#[test]
fn softmax_json() {
    let run = aec(&["check", "examples/softmax.rs", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout));
    let first = &json.as_array().expect("a JSON array of variants")[0];
    assert_eq!(first["name"], "Softmax");
    assert_eq!(first["pattern"], "parallel");
    for key in ["forward", "backward"] {
        let regions = first[key]
            .as_array()
            .unwrap_or_else(|| panic!("`{key}` is not an array"));
        assert!(!regions.is_empty(), "`{key}` is empty");
    }
}

#[test]
fn one_broken_variant_does_not_hide_a_good_one() {
    let path = "tests/cli_fixtures/two_variants.rs";
    let source = std::fs::read_to_string(root().join(path)).unwrap();
    let at = locate(&source, "|s| relux(s)", "relux");

    let run = aec(&["check", path]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(
        run.stderr.starts_with("error: unknown function `relux`\n"),
        "{}",
        run.stderr
    );
    assert_points_at(&run.stderr, &source, path, at, "relux");
    assert!(
        run.stderr.contains("= help: did you mean `relu`?"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("variant Good"),
        "the good variant is still printed:\n{}",
        run.stdout
    );
    assert!(!run.stdout.contains("Broken"), "{}", run.stdout);

    let run = aec(&["check", path, "--json"]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(
        run.stderr.contains("unknown function `relux`"),
        "{}",
        run.stderr
    );
    let json: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout));
    let names: Vec<&str> = json
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Good"]);
}

/// Where a `tests/ui/*.stderr` snapshot says the macro reported its error.
struct Snapshot {
    message: String,
    help: Option<String>,
    line: usize,
    col: usize,
}

fn read_snapshot(stderr: &str, rs: &str) -> Snapshot {
    let mut lines = stderr.lines();
    let message = lines
        .next()
        .and_then(|l| l.strip_prefix("error: "))
        .unwrap_or_else(|| panic!("{rs}: snapshot does not start with `error: `"))
        .to_string();
    let mut help = None;
    let mut at = None;
    for l in lines {
        let t = l.trim_start();
        if let Some(h) = t.strip_prefix("= help: ") {
            help.get_or_insert_with(|| h.to_string());
        }
        if let Some(loc) = t.strip_prefix(&format!("--> {rs}:")) {
            let (line, col) = loc.split_once(':').expect("line:col");
            at.get_or_insert((line.parse().unwrap(), col.parse().unwrap()));
        }
    }
    let (line, col) = at.unwrap_or_else(|| panic!("{rs}: no `--> {rs}:line:col` in snapshot"));
    Snapshot {
        message,
        help,
        line,
        col,
    }
}

/// The `attention!` macro and `aec check` share the frontend: on every UI case
/// the CLI must report the snapshot's message and help at the same line and
/// column.
#[test]
fn cli_agrees_with_the_macro_on_ui_cases() {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(root().join("tests/ui"))
        .expect("read tests/ui")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    entries.sort();
    assert!(entries.len() >= 10, "expected the UI cases in tests/ui");
    for p in entries {
        let name = p.file_name().unwrap().to_str().unwrap();
        let rs = format!("tests/ui/{name}");
        let Ok(snapshot) = std::fs::read_to_string(p.with_extension("stderr")) else {
            panic!("{rs} has no .stderr snapshot");
        };
        let want = read_snapshot(&snapshot, &rs);
        let run = aec(&["check", &rs]);
        assert_eq!(run.code, Some(EXIT_INPUT), "{rs}:\n{}", run.stderr);
        let first = run.stderr.lines().next().unwrap_or_default();
        assert_eq!(
            first,
            format!("error: {}", want.message),
            "{rs}: the CLI and the macro disagree on the message"
        );
        let help = run
            .stderr
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("= help: "))
            .map(str::to_string);
        assert_eq!(
            help, want.help,
            "{rs}: the CLI and the macro disagree on the help"
        );
        let loc = run
            .stderr
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("--> {rs}:")))
            .unwrap_or_else(|| panic!("{rs}: no location in:\n{}", run.stderr));
        let (line, col) = loc.split_once(':').unwrap();
        let (line, col): (usize, usize) = (line.parse().unwrap(), col.parse().unwrap());
        assert_eq!(
            line, want.line,
            "{rs}: the CLI and the macro disagree on the line"
        );
        assert_eq!(
            col, want.col,
            "{rs}: the CLI and the macro disagree on the column"
        );
    }
}

/// Writes `body` to a scratch file and checks it with the CLI.
fn check_text(name: &str, body: &str) -> (Run, String) {
    let path = scratch(name).join("variant.rs");
    std::fs::write(&path, body).expect("write variant");
    let shown = path.display().to_string();
    (aec(&["check", &shown]), shown)
}

#[test]
fn end_of_input_points_at_the_closing_delimiter() {
    let (run, shown) = check_text(
        "eof",
        "use aec::prelude::*;\n\n\nattention! { pub struct Z: parallel }\n",
    );
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("--> {shown}:4:37")),
        "the error must point at the closing brace on line 4:\n{}",
        run.stderr
    );
}

#[test]
fn grouped_query_heads_must_divide() {
    let body = "use aec::prelude::*;\nattention! { pub struct G: parallel { q: [B, H = 3, Sq, Dqk]; k: [B, Hkv = 2, Skv, Dqk]; v: [B, Hkv, Skv, Dv]; } }\n";
    let (run, shown) = check_text("gqa", body);
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("H = 3 query heads cannot be shared by Hkv = 2"),
        "{}",
        run.stderr
    );
    let (line, col) = locate(body, "Hkv = 2", "2");
    assert!(
        run.stderr.contains(&format!("--> {shown}:{line}:{col}")),
        "{}",
        run.stderr
    );
    // With only H fixed, the numeric check picks a key/value head count that divides it.
    let (run, _) = check_text("gqa-free", &body.replace("Hkv = 2", "Hkv"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn huge_fixed_sizes_are_refused_or_not_sampled() {
    let body = "use aec::prelude::*;\nattention! { pub struct G: parallel { q: [B, H, Sq, Dqk = 100000000000]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; } }\n";
    let (run, _) = check_text("huge", body);
    assert_eq!(run.code, Some(EXIT_INPUT), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("an axis size must be between 1 and 2^31 - 1"),
        "{}",
        run.stderr
    );
    let (run, _) = check_text("large", &body.replace("100000000000", "100000000"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("numeric check skipped"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("forward graph:"), "{}", run.stdout);
}

/// `aec devices` on a machine without GPUs: both vendors answer, exit 0.
#[test]
fn devices_lists_both_vendors_and_exits_cleanly() {
    let run = aec(&["devices"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("NVIDIA"), "{run:?}");
    let amd = run
        .stdout
        .lines()
        .find(|l| l.starts_with("AMD"))
        .expect("an AMD line");
    if cfg!(feature = "hip") {
        assert!(!amd.contains("without the `hip` feature"), "{amd}");
    } else {
        assert!(amd.contains("built without the `hip` feature"), "{amd}");
    }
}
