//! `aec check <variant.rs>`.

use super::EXIT_INPUT;
use aec_frontend::reference::{self, Inputs, Options, Tensor};
use aec_frontend::{Invocation, Variant, print};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// A Rust file with one or more `attention! { … }` variants (an `examples/*.rs` file).
    pub file: PathBuf,
    /// Print the variants as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Skip the numeric check that the online normalisation gives the same
    /// result for every KV block size.
    #[arg(long)]
    pub no_numeric: bool,
}

pub fn run(args: &CheckArgs) -> ExitCode {
    let shown = args.file.display().to_string();
    let source = match read_source(&args.file) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(EXIT_INPUT);
        }
    };
    let invocations = match aec_frontend::parse_file(&source) {
        Ok(v) => v,
        Err(d) => {
            eprint!("{}", d.render(&shown, &source));
            eprintln!(
                "note: `{shown}` must be a Rust source file holding `attention! {{ … }}` invocations"
            );
            return ExitCode::from(EXIT_INPUT);
        }
    };
    if invocations.is_empty() {
        eprintln!(
            "error: no `attention! {{ … }}` found in {shown}\n  = help: a variant file declares variants with `attention! {{ pub struct Name: parallel {{ … }} }}`; see examples/"
        );
        return ExitCode::from(EXIT_INPUT);
    }
    let mut failed = false;
    let mut json = Vec::new();
    for Invocation { variant, .. } in invocations {
        match variant {
            Err(d) => {
                eprint!("{}", d.render(&shown, &source));
                failed = true;
            }
            Ok(v) => {
                if !args.no_numeric
                    && let Err(msg) = numeric_check(&v)
                {
                    eprintln!("error: variant `{}` in {shown}: {msg}", v.name);
                    failed = true;
                    continue;
                }
                if args.json {
                    json.push(print::to_json(&v));
                } else {
                    print!("{}", print::render(&v));
                }
            }
        }
    }
    if args.json && !json.is_empty() {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::Value::Array(json))
                .expect("JSON values serialise")
        );
    }
    if failed {
        ExitCode::from(EXIT_INPUT)
    } else {
        ExitCode::SUCCESS
    }
}

fn read_source(path: &PathBuf) -> Result<String, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: no such file"),
        _ => format!("{shown}: {e}"),
    })?;
    if meta.is_dir() {
        return Err(format!(
            "{shown} is a directory; give a variant file such as examples/softmax.rs"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8 text"))?;
    if text.trim().is_empty() {
        return Err(format!(
            "{shown} is empty; a variant file holds `attention! {{ … }}` invocations"
        ));
    }
    Ok(text)
}

/// Runs the reference forward on a small random problem with several KV block
/// sizes: a correct online normalisation gives the same output for each.
fn numeric_check(v: &Variant) -> Result<(), String> {
    if let Some((a, n)) = v.fixed_sizes.iter().find(|(_, n)| *n > MAX_SAMPLED_SIZE) {
        eprintln!(
            "note: variant `{}`: numeric check skipped: the fixed size {a} = {n} is too large to sample on the CPU (limit {MAX_SAMPLED_SIZE})",
            v.name
        );
        return Ok(());
    }
    let inputs = sample_inputs(v);
    let whole = reference::forward(v, &inputs, Options::default()).map_err(|e| e.to_string())?;
    if whole.o.data.iter().any(|x| !x.is_finite()) {
        return Err("the reference forward gives non-finite outputs on random inputs (custom inputs drawn from 0.25, 0.5, 0.75)".into());
    }
    for block in [1, 3, 4] {
        let blocked = reference::forward(v, &inputs, Options { block: Some(block) })
            .map_err(|e| e.to_string())?;
        let err = blocked.o.rel_err(&whole.o);
        // NaN must fail too, hence not `err >= 1e-9`.
        if err.is_nan() || err >= 1e-9 {
            return Err(format!(
                "the online normalisation is not block-invariant: with KV blocks of {block} the output differs from the whole-row result by {err:.2e} (relative)\n  = help: `fwd`'s rescale factor must turn the running output for the old state into the one for the new state (softmax: `exp(st.m - m)`)"
            ));
        }
    }
    Ok(())
}

/// The largest fixed axis size the numeric check samples.
const MAX_SAMPLED_SIZE: usize = 1024;

/// Small random inputs (sizes that are not tile multiples), deterministic.
fn sample_inputs(v: &Variant) -> Inputs {
    use aec_frontend::ir::Axis;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let size = |a: Axis| -> usize {
        if let Some((_, n)) = v.fixed_sizes.iter().find(|(x, _)| *x == a) {
            return *n;
        }
        match a {
            Axis::B => 2,
            Axis::H => 4,
            // A divisor of H, so that grouped-query heads always divide evenly.
            Axis::Hkv => match v.fixed_sizes.iter().find(|(x, _)| *x == Axis::H) {
                Some((_, h)) => (1..=2).rev().find(|g| h % g == 0).unwrap_or(1),
                None => 2,
            },
            Axis::Sq => 7,
            Axis::Skv => 11,
            Axis::S => 9,
            Axis::Dqk | Axis::Dk => 5,
            Axis::Dv => 3,
        }
    };
    let mut draw =
        |shape: &[usize], lo: f64, hi: f64| Tensor::from_fn(shape, |_| lo + (hi - lo) * next());
    let shape = |axes: &[Axis]| axes.iter().map(|a| size(*a)).collect::<Vec<usize>>();
    let (q, k, vv) = (
        draw(&shape(&v.q.axes), -1.0, 1.0),
        draw(&shape(&v.k.axes), -1.0, 1.0),
        draw(&shape(&v.v.axes), -1.0, 1.0),
    );
    // Custom inputs: broadcast axes sized like the problem, user axes as
    // declared (or 9); a few values in (0, 1) — valid for gates, decays and
    // slopes alike, and equal often enough that masks comparing ids
    // (documents) see matches.
    let customs = v
        .customs
        .iter()
        .map(|c| {
            let mut dims = shape(&c.axes);
            dims.extend(
                c.user_axes
                    .iter()
                    .map(|(_, n)| n.unwrap_or(9).min(MAX_SAMPLED_SIZE)),
            );
            let t = draw(&dims, 0.0, 1.0).map(|x| [0.25, 0.5, 0.75][(x * 3.0) as usize % 3]);
            (c.name.clone(), t)
        })
        .collect();
    Inputs {
        q,
        k,
        v: vv,
        customs,
        initial_state: None,
        initial_normalizer: None,
    }
}
