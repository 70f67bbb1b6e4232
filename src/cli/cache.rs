//! `aec cache`: look at and manage the autotuner's persistent tuning cache
//! (`aec_runtime::tuning`): list and show its entries, clear some or all,
//! export them to a file and import them on another machine.

use super::EXIT_INPUT;
use aec::runtime::tuning::{TunedEntry, TuningCache, TuningCacheError, performance_portability};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct CacheArgs {
    /// The tuning cache file (default: $AEC_TUNING_CACHE, else
    /// $XDG_CACHE_HOME/aec/tuning-v1.json, else ~/.cache/aec/tuning-v1.json).
    #[arg(long, global = true, value_name = "PATH")]
    pub file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// List the entries, one line each, and the performance portability Φ
    /// of each problem tuned on more than one GPU.
    ///
    /// A line has the entry's index, variant, kernel, target, GPU, dtype,
    /// head dims, shape bucket, configuration, best time and speedup over
    /// the default configuration.
    List,
    /// Show everything recorded for the entries with this index (from
    /// `list`) or variant name, rejected plans included.
    Show {
        /// An index shown by `aec cache list`, or a variant name.
        #[arg(value_name = "INDEX|VARIANT")]
        which: String,
    },
    /// Remove every entry, or those matching all the filters given.
    Clear {
        /// Only entries of this variant (exact name).
        #[arg(long, value_name = "NAME")]
        variant: Option<String>,
        /// Only entries whose GPU name contains this (case-insensitive).
        #[arg(long, value_name = "SUBSTRING")]
        gpu: Option<String>,
    },
    /// Write every entry to FILE (in the cache file format).
    Export {
        #[arg(value_name = "FILE")]
        to: PathBuf,
    },
    /// Merge the entries of FILE (written by `export`) into the cache.
    Import {
        #[arg(value_name = "FILE")]
        from: PathBuf,
    },
}

/// Exit code for failures that are not the user's input (a cache file that
/// cannot be written).
const EXIT_FAILURE: u8 = 1;

pub fn run(args: &CacheArgs) -> ExitCode {
    match execute(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}

type Failure = (u8, String);

fn execute(args: &CacheArgs) -> Result<(), Failure> {
    let path = match &args.file {
        Some(p) => p.clone(),
        None => TuningCache::default_path().ok_or_else(|| {
            (
                EXIT_INPUT,
                "no tuning cache location: set AEC_TUNING_CACHE or HOME (or pass --file PATH)"
                    .to_string(),
            )
        })?,
    };
    let (mut cache, warning) = TuningCache::open(&path);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    let written = |e: TuningCacheError| (EXIT_FAILURE, e.to_string());
    match &args.command {
        CacheCommand::List => list(&cache, &path),
        CacheCommand::Show { which } => show(&cache, &path, which)?,
        CacheCommand::Clear { variant, gpu } => {
            let gpu = gpu.as_ref().map(|g| g.to_lowercase());
            let n = cache
                .remove_where(|e| {
                    variant.as_ref().is_none_or(|v| e.key.variant == *v)
                        && gpu
                            .as_ref()
                            .is_none_or(|g| e.key.gpu.to_lowercase().contains(g))
                })
                .map_err(written)?;
            println!(
                "removed {} from the tuning cache {}",
                count(n),
                path.display()
            );
        }
        CacheCommand::Export { to } => {
            let n = cache.export(to).map_err(written)?;
            println!("exported {} to {}", count(n), to.display());
        }
        CacheCommand::Import { from } => {
            let n = cache.import(from).map_err(|e| {
                // Problems with the file imported are the user's input;
                // anything else is writing the cache.
                let input = match &e {
                    TuningCacheError::Corrupt { .. } | TuningCacheError::Version { .. } => true,
                    TuningCacheError::Io { path, .. } => path == from,
                    _ => false,
                };
                (if input { EXIT_INPUT } else { EXIT_FAILURE }, e.to_string())
            })?;
            println!(
                "imported {} from {} into {}",
                count(n),
                from.display(),
                path.display()
            );
        }
    }
    Ok(())
}

/// "1 entry", "3 entries".
fn count(n: usize) -> String {
    format!("{n} {}", if n == 1 { "entry" } else { "entries" })
}

fn dims(e: &TunedEntry) -> String {
    format!("{}/{}", e.key.dqk, e.key.dv)
}

/// The shape bucket, lengths being powers of two covering the lengths up to
/// them.
fn shape(e: &TunedEntry) -> String {
    let s = &e.key.shape;
    format!("b{} h{}/{} sq{} skv{}", s.b, s.h, s.hkv, s.sq, s.skv)
}

fn list(cache: &TuningCache, path: &Path) {
    if cache.is_empty() {
        println!("the tuning cache {} is empty", path.display());
        return;
    }
    println!("tuning cache {}: {}", path.display(), count(cache.len()));
    let mut rows = vec![
        [
            "#", "variant", "kernel", "target", "gpu", "dtype", "dims", "shape", "config",
            "best µs", "speedup",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for (i, e) in cache.entries().enumerate() {
        let k = &e.key;
        rows.push(vec![
            i.to_string(),
            k.variant.clone(),
            k.kernel.clone(),
            k.target.clone(),
            k.gpu.clone(),
            k.dtype.clone(),
            dims(e),
            shape(e),
            e.config_label.clone(),
            format!("{:.2}", e.best_us),
            format!("{:.2}x", e.speedup()),
        ]);
    }
    print_table(&rows, &[0, 9, 10]);

    // Φ per problem tuned on several GPUs: the best efficiency per GPU, since
    // one GPU may have entries for several drivers or toolkits.
    let mut problems: BTreeMap<Problem, BTreeMap<&str, f64>> = BTreeMap::new();
    for e in cache.entries() {
        let k = &e.key;
        let problem = (
            k.variant.clone(),
            k.kernel.clone(),
            k.dtype.clone(),
            dims(e),
            shape(e),
        );
        let best = problems
            .entry(problem)
            .or_default()
            .entry(&k.gpu)
            .or_insert(0.0);
        *best = best.max(e.efficiency);
    }
    let portable: Vec<_> = problems.iter().filter(|(_, g)| g.len() > 1).collect();
    if !portable.is_empty() {
        println!();
        println!("performance portability Φ (harmonic mean of the efficiencies over the GPUs):");
        for ((variant, kernel, dtype, dims, shape), gpus) in portable {
            let effs: Vec<f64> = gpus.values().copied().collect();
            let each: Vec<String> = gpus.iter().map(|(g, e)| format!("{g} {e:.3}")).collect();
            println!(
                "  {variant} {kernel} {dtype} {dims} {shape}: Φ = {:.3} over {} GPUs ({})",
                performance_portability(&effs),
                gpus.len(),
                each.join(", ")
            );
        }
    }
}

/// What Φ is computed over GPUs for: variant, kernel, dtype, head dims and
/// shape bucket, as displayed.
type Problem = (String, String, String, String, String);

/// Prints rows with columns padded to their widest cell; the columns in
/// `right` (numbers) aligned right.
fn print_table(rows: &[Vec<String>], right: &[usize]) {
    let columns = rows.first().map_or(0, Vec::len);
    let width: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let pad = " ".repeat(width[c] - cell.chars().count());
                if right.contains(&c) {
                    format!("{pad}{cell}")
                } else if c + 1 == columns {
                    cell.clone()
                } else {
                    format!("{cell}{pad}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

fn show(cache: &TuningCache, path: &Path, which: &str) -> Result<(), Failure> {
    let all: Vec<&TunedEntry> = cache.entries().collect();
    let chosen: Vec<(usize, &TunedEntry)> = match which.parse::<usize>() {
        Ok(i) => all.get(i).map(|e| vec![(i, *e)]).ok_or_else(|| {
            (
                EXIT_INPUT,
                format!(
                    "no entry {i} in the tuning cache {}: it has {} (`aec cache list` shows them)",
                    path.display(),
                    count(all.len())
                ),
            )
        })?,
        Err(_) => {
            let matching: Vec<_> = all
                .iter()
                .enumerate()
                .filter(|(_, e)| e.key.variant == which)
                .map(|(i, e)| (i, *e))
                .collect();
            if matching.is_empty() {
                let mut names: Vec<&str> = all.iter().map(|e| e.key.variant.as_str()).collect();
                names.dedup();
                let known = if names.is_empty() {
                    "it is empty".to_string()
                } else {
                    format!("its variants: {}", names.join(", "))
                };
                return Err((
                    EXIT_INPUT,
                    format!(
                        "no entry for variant `{which}` in the tuning cache {} ({known})",
                        path.display()
                    ),
                ));
            }
            matching
        }
    };
    for (n, (i, e)) in chosen.into_iter().enumerate() {
        if n > 0 {
            println!();
        }
        show_entry(i, e);
    }
    Ok(())
}

fn show_entry(i: usize, e: &TunedEntry) {
    let k = &e.key;
    let s = &k.shape;
    println!("[{i}] {} ({})", k.variant, k.kernel);
    let field = |name: &str, value: String| println!("  {name:<16}{value}");
    field("variant hash", k.variant_hash.clone());
    field("template", k.template_version.clone());
    field("target", k.target.clone());
    field("gpu", k.gpu.clone());
    field("driver", k.driver.clone());
    field("toolkit", k.toolkit.clone());
    field("dtype", k.dtype.clone());
    field("head dims", format!("Dqk {}, Dv {}", k.dqk, k.dv));
    field(
        "shape bucket",
        format!(
            "B {}, H {}, Hkv {}, Sq ≤ {}, Skv ≤ {} (lengths bucketed to powers of two)",
            s.b, s.h, s.hkv, s.sq, s.skv
        ),
    );
    field("config", e.config_label.clone());
    field("config (json)", e.config.to_string());
    field(
        "best",
        format!(
            "{:.2} µs ({:.1} TFLOP/s, efficiency {:.3} of peak)",
            e.best_us, e.tflops, e.efficiency
        ),
    );
    field(
        "default",
        format!("{:.2} µs (speedup {:.2}x)", e.default_us, e.speedup()),
    );
    field(
        "median",
        format!(
            "{:.2} µs (tuning impact median/best {:.2}x)",
            e.median_us,
            e.impact()
        ),
    );
    field(
        "plans tried",
        format!("{} in {:.1} s of tuning", e.plans_tried, e.tuning_seconds),
    );
    if e.rejected.is_empty() {
        field("rejected", "none".into());
    } else {
        let n = e.rejected.len();
        field(
            "rejected",
            format!("{n} plan{}", if n == 1 { "" } else { "s" }),
        );
        for r in &e.rejected {
            println!("    {}: {}", r.config, r.reason);
        }
    }
}
