//! The loaders' HIP backend on a machine without an AMD GPU, against
//! `tests/c/fake_hip.c`: a test double of ROCm's `libamdhip64.so` that plays
//! a gfx942 device whose memory is host memory, accepts only gfx942 code
//! objects, finds entries only if they are in the image, and logs each
//! launch instead of running it.
//!
//! A softmax and Mamba2 (recurrent) library is compiled for mi250 and
//! mi300x with the real HIP toolchain. The C program `tests/c/hip_loader_check.c`, built against its
//! header, opens it (only the HIP backend is tried), runs the forward and
//! the backward of both (Mamba2's backward from two modules), and checks
//! errors by name; this test then compares every
//! logged launch with the manifest's plan for those sizes: entry, grid,
//! block, shared memory, pointers and 32-bit sizes, in order. Then the
//! Python module's HIP tests (`HipBuilds` in
//! `tests/python/test_aec_library.py`) run its HIP driver over the same
//! double and library.
//!
//! Needs `cc` and the HIP toolchain (`cargo xtask toolchains`); without them
//! the test is skipped with a note, or fails where `AEC_REQUIRE_TOOLCHAINS=1`.

mod common;

use aec::runtime::{find_hip_compiler, toolchains_required};
use common::{repo, show};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn ready() -> bool {
    let mut missing: Vec<String> = ["gfx90a", "gfx942"]
        .iter()
        .filter_map(|g| find_hip_compiler(g).err().map(|e| e.to_string()))
        .collect();
    if !common::tool_runs("cc") {
        missing.push("`cc` (a C compiler) not found".into());
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!("the HIP loader test needs: {}", missing.join("; "));
    assert!(!toolchains_required(), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(out.status.success(), "{what} failed: {}", show(&out));
    out
}

/// Compiles the test double into `dir/libamdhip64.so`.
fn build_fake_hip(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    run(
        Command::new("cc")
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC",
            ])
            .arg(repo().join("tests/c/fake_hip.c"))
            .arg("-o")
            .arg(dir.join("libamdhip64.so")),
        "cc fake_hip.c",
    );
}

/// A size expression of a launch plan, evaluated.
fn eval(expr: &Value, sizes: &[(&str, u64)]) -> u64 {
    match expr {
        Value::Number(n) => n.as_u64().expect("a size"),
        Value::String(name) => {
            sizes
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("size {name}"))
                .1
        }
        Value::Object(o) => {
            let (op, args) = o.iter().next().expect("an operation");
            let v: Vec<u64> = args
                .as_array()
                .expect("operands")
                .iter()
                .map(|a| eval(a, sizes))
                .collect();
            match op.as_str() {
                "mul" => v.iter().product(),
                "add" => v.iter().sum(),
                "ceil_div" => v[0].div_ceil(v[1]),
                "floor_div" => v[0] / v[1],
                "min" => *v.iter().min().unwrap(),
                "max" => *v.iter().max().unwrap(),
                other => panic!("operation {other}"),
            }
        }
        other => panic!("size expression {other}"),
    }
}

/// The gfx942 record of `pass` in the manifest's variant `name`.
fn record<'a>(manifest: &'a Value, name: &str, pass: &str) -> &'a Value {
    manifest["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variant {name}"))["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["pass"] == pass && k["builds"][0]["arch"] == "gfx942")
        .unwrap_or_else(|| panic!("no gfx942 {pass} record of {name}"))
}

/// The log lines the plan's launches should produce with `ptrs` (buffer
/// name -> address) for `sizes`.
fn expected_launches(rec: &Value, sizes: &[(&str, u64)], ptrs: &[(&str, &str)]) -> Vec<String> {
    rec["plan"]["launches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let grid: Vec<String> = l["grid"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| eval(g, sizes).to_string())
                .collect();
            let mut args = String::new();
            let mut ints = String::new();
            for a in l["args"].as_array().unwrap() {
                if let Some(p) = a.get("ptr").and_then(Value::as_str) {
                    let addr = ptrs
                        .iter()
                        .find(|(n, _)| *n == p)
                        .map(|(_, a)| a.to_string())
                        .unwrap_or_else(|| "workspace".into());
                    args.push_str(&format!(" p{addr}"));
                } else if a.get("null").is_some() {
                    args.push_str(" p0");
                } else {
                    ints.push_str(&format!(" i{}", eval(&a["i32"], sizes)));
                }
            }
            format!(
                "launch {} grid {} block {} 1 1 smem {} args{args}{ints}",
                l["entry"].as_str().unwrap(),
                grid.join(" "),
                l["threads"],
                l["dynamic_smem_bytes"]
            )
        })
        .collect()
}

/// The addresses a `forward ptrs` / `backward ptrs` line printed.
fn printed<'a>(stdout: &'a str, prefix: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in {stdout}"))
        .split_whitespace()
        .collect()
}

/// Matches logged launches against the expected ones; workspace pointers
/// (allocated inside the call) only have to be 256-byte aligned.
fn assert_launches(logged: &[&str], expected: &[String]) {
    assert_eq!(
        logged.len(),
        expected.len(),
        "launches: {logged:#?}\nexpected: {expected:#?}"
    );
    for (got, want) in logged.iter().zip(expected) {
        let (g, w): (Vec<&str>, Vec<&str>) = (
            got.split_whitespace().collect(),
            want.split_whitespace().collect(),
        );
        assert_eq!(g.len(), w.len(), "{got}\nexpected {want}");
        for (a, b) in g.iter().zip(&w) {
            if *b == "pworkspace" {
                let addr = u64::from_str_radix(a.trim_start_matches('p'), 16).expect("an address");
                assert!(
                    addr != 0 && addr % 256 == 0,
                    "workspace pointer {a} in {got}"
                );
            } else {
                assert_eq!(a, b, "{got}\nexpected {want}");
            }
        }
    }
}

#[test]
fn c_loader_runs_hip_code_objects_through_the_hip_runtime() {
    if !ready() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("lib");
    run(
        Command::new(env!("CARGO_BIN_EXE_aec"))
            .arg("compile")
            .arg(repo().join("examples/softmax.rs"))
            .arg(repo().join("examples/mamba2.rs"))
            .args(["--target", "mi250,mi300x", "--no-tuning", "-o"])
            .arg(&lib),
        "aec compile --target mi250,mi300x",
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(lib.join("manifest.json")).unwrap()).unwrap();
    let fake = tmp.path().join("fake-rocm");
    build_fake_hip(&fake);
    let exe = tmp.path().join("hip_loader_check");
    run(
        Command::new("cc")
            .args([
                "-std=c99",
                "-pedantic",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-O2",
            ])
            .arg("-D_POSIX_C_SOURCE=200809L")
            .arg("-I")
            .arg(lib.join("include"))
            .arg(repo().join("tests/c/hip_loader_check.c"))
            .arg("-o")
            .arg(&exe)
            .arg("-ldl"),
        "cc hip_loader_check.c",
    );
    let log = tmp.path().join("launches.log");
    let out = Command::new(&exe)
        .arg(&lib)
        .env("LD_LIBRARY_PATH", &fake)
        .env("AEC_FAKE_HIP_LOG", &log)
        .output()
        .expect("run hip_loader_check");
    assert!(out.status.success(), "hip_loader_check: {}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains(
            "opened on AMD Instinct MI300X (aec test double) (gfx942, 304 compute units)"
        ),
        "{}",
        show(&out)
    );

    let sizes = [
        ("B", 2),
        ("H", 3),
        ("Hkv", 3),
        ("Sq", 77),
        ("Skv", 100),
        ("sms", 304),
    ];
    let fwd = printed(&stdout, "forward ptrs ");
    let bwd = printed(&stdout, "backward ptrs ");
    let fwd_ptrs: Vec<(&str, &str)> = ["q", "k", "v", "o", "row_outputs"]
        .into_iter()
        .zip(fwd.iter().copied())
        .collect();
    let bwd_ptrs: Vec<(&str, &str)> = ["q", "k", "v", "o", "dout", "row_outputs", "dq", "dk", "dv"]
        .into_iter()
        .zip(bwd.iter().copied())
        .collect();
    let forward = record(&manifest, "Softmax", "forward");
    let backward = record(&manifest, "Softmax", "backward");
    assert!(
        stdout.contains(&format!(
            "forward kernel {}",
            forward["entry"].as_str().unwrap()
        )),
        "{stdout}"
    );
    let mut expected = expected_launches(forward, &sizes, &fwd_ptrs);
    expected.extend(expected_launches(backward, &sizes, &bwd_ptrs));
    // The recurrent forward (its plan passes a null `cu_seqlens`).
    let mamba2 = record(&manifest, "Mamba2", "forward");
    let m_ptrs: Vec<(&str, &str)> = ["q", "k", "v", "a", "dt", "o", "state_in", "state_out"]
        .into_iter()
        .zip(printed(&stdout, "mamba2 ptrs "))
        .collect();
    expected.extend(expected_launches(
        mamba2,
        &[("B", 2), ("H", 3), ("S", 150)],
        &m_ptrs,
    ));
    // Its backward: the states pass (the `states` module), then the kernels.
    let m_bwd = record(&manifest, "Mamba2", "backward");
    let names = [
        "q",
        "k",
        "v",
        "a",
        "dt",
        "do",
        "state_in",
        "d_state_out",
        "dq",
        "dk",
        "dv",
        "da",
        "ddt",
        "d_state_in",
    ];
    let mb_ptrs: Vec<(&str, &str)> = names
        .into_iter()
        .zip(printed(&stdout, "mamba2 bwd ptrs "))
        .collect();
    let m_bwd_launches = expected_launches(m_bwd, &[("B", 2), ("H", 3), ("S", 150)], &mb_ptrs);
    assert_eq!(m_bwd_launches.len(), 5, "{m_bwd_launches:?}");
    expected.extend(m_bwd_launches);
    let text = std::fs::read_to_string(&log).expect("the double's launch log");
    let logged: Vec<&str> = text.lines().collect();
    assert_launches(&logged, &expected);
    // The forward grid covers 77 query rows with 64-row blocks: 2 x H x B.
    assert!(
        logged[0].contains(" grid 2 3 2 block 256 1 1 smem 0 "),
        "{}",
        logged[0]
    );
    // Mamba2 at Dk = Dv = 128: 64-column slices of four waves, 2 x H x B.
    let m = logged
        .iter()
        .find(|l| l.contains("aec_rec_fwd_mamba2"))
        .expect("a Mamba2 launch");
    assert!(m.contains(" grid 2 3 2 block 256 1 1 smem 0 "), "{m}");
    assert!(stdout.contains("mamba2 wrong Dk: "), "{stdout}");
    assert!(stdout.contains("failed: hipErrorLaunchFailure"), "{stdout}");

    // The Python module's HIP driver over the same double and library.
    let py = Command::new("python3")
        .args(["-m", "unittest", "-v", "tests/python/test_aec_library.py"])
        .env("AEC_TEST_HIP_LIBRARY", &lib)
        .env("AEC_TEST_FAKE_HIP", fake.join("libamdhip64.so"))
        .env("AEC_FAKE_HIP_LOG", tmp.path().join("python-launches.log"))
        .env_remove("AEC_TEST_LIBRARY")
        .env_remove("AEC_TEST_MANIFEST")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(repo())
        .output();
    let Ok(py) = py else {
        let msg = "python3 not found: the Python module's HIP driver is not tested";
        assert!(!toolchains_required(), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    };
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
    assert!(py.status.success(), "the Python HIP tests failed:\n{log}");
    for test in [
        "test_code_objects_are_chosen_by_gfx_arch",
        "test_hip_grid_limit",
        "test_driver_loads_and_launches_through_the_hip_runtime",
    ] {
        assert!(
            log.contains(&format!("HipBuilds.{test}) ... ok")),
            "{test} did not run:\n{log}"
        );
    }
}
