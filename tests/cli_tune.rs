//! `aec tune` without a GPU: the model's ranking for a named device (AMD
//! included; the backward's tiles for CUDA devices), clear errors for bad
//! shapes (of the other kind of variant), bad custom-input ranges, a
//! recurrent kernel or an AMD backward asked of the cost model and a
//! missing GPU.

use std::process::Command;

fn aec(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "AEC_TUNING_CACHE",
            std::env::temp_dir().join("aec-cli-tune-unused.json"),
        )
        .output()
        .expect("run aec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn target_ranks_with_the_model_without_a_gpu() {
    for target in ["h100", "mi300x"] {
        let (code, out, err) = aec(&[
            "tune",
            "examples/softmax_causal.rs",
            "--shape",
            "4,8,8,1000,1000",
            "--target",
            target,
            "--top",
            "3",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("cost model only, nothing measured"), "{out}");
        assert!(out.contains("plans fit"), "{out}");
        // Three ranked plans, each with an estimate.
        assert_eq!(out.matches(" µs ").count(), 3, "{out}");
    }
    // The backward's tiles: at DeepSeek's benchmark shape its default (48
    // queries per step with dQ transposed on each warpgroup's own keys, the
    // producer) first, the paired 32-query steps next, and the tiles the
    // generator refuses counted.
    let (code, out, err) = aec(&[
        "tune",
        "examples/deepseek.rs",
        "--head-dims",
        "192x128",
        "--backward",
        "--shape",
        "8,16,16,2048,2048",
        "--target",
        "h100",
        "--top",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the backward on h100 (cost model only, nothing measured)"),
        "{out}"
    );
    assert!(out.contains("plans fit, 3 rejected"), "{out}");
    let ranked: Vec<&str> = out.lines().filter(|l| l.contains(" µs ")).collect();
    assert_eq!(ranked.len(), 2, "{out}");
    assert!(
        ranked[0].trim_start().starts_with("m48w8 wgmma ws tma ")
            && ranked[1].trim_start().starts_with("m32w8 wgmma ws tma "),
        "{out}"
    );
}

#[test]
fn bad_input_is_refused_with_the_problem_named() {
    // Softmax has no grouped-query heads.
    let (code, _, err) = aec(&[
        "tune",
        "examples/softmax.rs",
        "--shape",
        "4,8,4,1000,1000",
        "--target",
        "h100",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--shape") && err.contains("Hkv"), "{err}");
    let (code, _, err) = aec(&[
        "tune",
        "examples/softmax.rs",
        "--shape",
        "4,8",
        "--target",
        "h100",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("B,H,Hkv,Sq,Skv"), "{err}");
    let (code, _, err) = aec(&[
        "tune",
        "examples/mamba2.rs",
        "--shape",
        "1,8,8,256,256",
        "--target",
        "h100",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("recurrent variant"), "{err}");
    // Shapes of the other kind of variant, and what a recurrent variant
    // cannot be asked.
    let (code, _, err) = aec(&["tune", "examples/softmax.rs", "--shape", "4,8,1000"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("parallel variant") && err.contains("B,H,Hkv,Sq,Skv"),
        "{err}"
    );
    for extra in [
        &["--target", "h100"][..],
        &["--backward", "--target", "h100"][..],
    ] {
        let mut args = vec![
            "tune",
            "examples/mamba2.rs",
            "--head-dims",
            "128x64",
            "--shape",
            "1,8,256",
        ];
        args.extend_from_slice(extra);
        let (code, _, err) = aec(&args);
        assert_eq!(code, 2, "{extra:?}");
        assert!(
            err.contains("--target") && err.contains("recurrent") && err.contains("no cost model"),
            "{err}"
        );
        let kernel = if extra[0] == "--backward" {
            "the recurrent backward"
        } else {
            "the recurrent forward"
        };
        assert!(err.contains(kernel), "{err}");
    }
    for bad in ["a", "a=1", "a=2,1", "=1,2", "a=x,1"] {
        let (code, _, err) = aec(&[
            "tune",
            "examples/mamba2.rs",
            "--shape",
            "1,8,256",
            "--custom-range",
            bad,
        ]);
        assert_eq!(code, 2, "{bad}");
        assert!(err.contains("NAME=LO,HI"), "{bad}: {err}");
    }
    // The backward's tiles are CUDA's.
    let (code, _, err) = aec(&[
        "tune",
        "examples/softmax.rs",
        "--backward",
        "--shape",
        "4,8,8,1000,1000",
        "--target",
        "mi300x",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--backward --target mi300x") && err.contains("AMD device"),
        "{err}"
    );
    let (code, _, err) = aec(&["tune", "examples/nope.rs", "--shape", "1,8,8,256,256"]);
    assert_eq!(code, 2);
    assert!(err.contains("examples/nope.rs"), "{err}");
}

#[test]
fn without_a_gpu_tuning_says_so() {
    if aec::runtime::driver_present() {
        return; // a GPU machine tunes instead
    }
    let (code, _, err) = aec(&["tune", "examples/softmax.rs", "--shape", "4,8,8,1000,1000"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no CUDA GPU found") && err.contains("--target"),
        "{err}"
    );
    let (code, _, err) = aec(&[
        "tune",
        "examples/softmax.rs",
        "--backward",
        "--shape",
        "4,8,8,1000,1000",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no CUDA GPU found") && err.contains("backward"),
        "{err}"
    );
    let (code, _, err) = aec(&[
        "tune",
        "examples/mamba2.rs",
        "--head-dims",
        "128x64",
        "--backward",
        "--shape",
        "1,8,256",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no CUDA GPU found") && err.contains("recurrent"),
        "{err}"
    );
}
