//! Reading `ptxas -v` output: registers, spills and shared memory per kernel,
//! the numbers the compile checks and the scheduler's limits are about.

/// What ptxas reports for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// The entry function's (mangled, for non-`extern "C"`) name.
    pub function: String,
    /// The architecture it was assembled for (`sm_80`).
    pub arch: String,
    pub registers: u32,
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory (dynamic shared memory is a launch parameter).
    pub shared_bytes: u32,
    pub barriers: u32,
    /// ptxas's "Potential Performance Loss" notes about this function (e.g.
    /// C7514: `wgmma` serialised because other instructions touch its
    /// registers while it runs).
    pub performance_warnings: Vec<String>,
}

impl ResourceUsage {
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// Parses the `ptxas info` lines of `ptxas -v`; one entry per compiled
/// entry function, in order.
pub fn parse_ptxas_verbose(output: &str) -> Vec<ResourceUsage> {
    let mut all: Vec<ResourceUsage> = Vec::new();
    let mut current: Option<usize> = None;
    // ptxas prints these notes in an early pass, before any entry's
    // "Compiling entry function" line: attached by name at the end.
    let mut notes: Vec<(String, String)> = Vec::new();
    for line in output.lines() {
        let line = line.trim();
        if line.contains("Performance Loss") {
            if let Some(name) = line
                .split("in the function '")
                .nth(1)
                .and_then(|r| r.split('\'').next())
            {
                notes.push((name.to_string(), line.to_string()));
            }
            continue;
        }
        let info = line
            .strip_prefix("ptxas info")
            .map(|r| r.trim_start().strip_prefix(':').unwrap_or(r).trim());
        if let Some(rest) = info.and_then(|i| i.strip_prefix("Compiling entry function")) {
            let (function, arch) = quoted_pair(rest);
            all.push(ResourceUsage {
                function,
                arch,
                ..ResourceUsage::default()
            });
            current = Some(all.len() - 1);
            continue;
        }
        if let Some(rest) = info.and_then(|i| i.strip_prefix("Function properties for")) {
            // Properties of a non-entry (device) function: not ours to record.
            let name = rest.trim().trim_matches('\'');
            current = all.iter().position(|u| u.function == name);
            continue;
        }
        let Some(u) = current.and_then(|i| all.get_mut(i)) else {
            continue;
        };
        // NVRTC's log (`--ptxas-options=-v`) prefixes the properties line
        // with `ptxas         .`; ptxas itself indents it.
        let body = info.unwrap_or_else(|| {
            line.strip_prefix("ptxas").map_or(line, |r| {
                r.trim_start().trim_start_matches('.').trim_start()
            })
        });
        for item in body.split(',') {
            let item = item.trim();
            let Some((n, what)) = leading_number(item) else {
                continue;
            };
            match what {
                w if w.starts_with("registers") => u.registers = n,
                w if w.starts_with("bytes stack frame") => u.stack_frame_bytes = n,
                w if w.starts_with("bytes spill stores") => u.spill_store_bytes = n,
                w if w.starts_with("bytes spill loads") => u.spill_load_bytes = n,
                w if w.starts_with("bytes smem") => u.shared_bytes = n,
                w if w.starts_with("barriers") => u.barriers = n,
                _ => {}
            }
        }
    }
    for (name, line) in notes {
        if let Some(u) = all.iter_mut().find(|u| u.function == name) {
            u.performance_warnings.push(line);
        }
    }
    all
}

/// `'name' for 'sm_80'` → (name, sm_80).
fn quoted_pair(s: &str) -> (String, String) {
    let parts: Vec<&str> = s.split('\'').collect();
    (
        parts.get(1).copied().unwrap_or("").to_string(),
        parts.get(3).copied().unwrap_or("").to_string(),
    )
}

/// `Used 40 registers` / `40 bytes smem` → (40, "registers" / "bytes smem").
fn leading_number(item: &str) -> Option<(u32, &str)> {
    let item = item
        .strip_prefix("Used ")
        .or_else(|| item.strip_prefix("used "))
        .unwrap_or(item);
    let end = item.find(|c: char| !c.is_ascii_digit())?;
    let n = item[..end].parse().ok()?;
    Some((n, item[end..].trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC 13.0's log with `--ptxas-options=-v`: the properties line
    /// starts with `ptxas .` instead of an indent.
    #[test]
    fn nvrtc_log_with_ptxas_verbose_parses() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
ptxas info    : Function properties for k\n\
ptxas         .     256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 32 registers, used 1 barriers, 256 bytes cumulative stack size\n\
ptxas info    : Compile time = 22.054 ms\n";
        let u = parse_ptxas_verbose(log);
        assert_eq!(u.len(), 1);
        assert_eq!(
            (u[0].function.as_str(), u[0].arch.as_str()),
            ("k", "sm_90a")
        );
        assert_eq!(
            (u[0].registers, u[0].barriers, u[0].stack_frame_bytes),
            (32, 1, 256)
        );
        assert_eq!((u[0].spill_store_bytes, u[0].spill_load_bytes), (8, 12));
        assert!(u[0].spills());
    }

    /// Real `ptxas -v -arch=sm_90a` output (CUDA 13.0.88): the note comes
    /// before every entry's lines.
    #[test]
    fn performance_warnings_printed_before_their_function_attach_to_it() {
        let out = "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.AR in divergent path in the function 'k_main'\n\
ptxas info    : 11 bytes gmem\n\
ptxas info    : Compiling entry function 'k_post' for 'sm_90a'\n\
ptxas info    : Function properties for k_post\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 22 registers, used 0 barriers\n\
ptxas info    : Compiling entry function 'k_main' for 'sm_90a'\n\
ptxas info    : Function properties for k_main\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 168 registers, used 16 barriers\n";
        let u = parse_ptxas_verbose(out);
        assert_eq!(u.len(), 2);
        assert!(u[0].performance_warnings.is_empty(), "{:?}", u[0]);
        assert_eq!(u[1].function, "k_main");
        assert_eq!(u[1].performance_warnings.len(), 1);
        assert!(u[1].performance_warnings[0].contains("C7520"));
    }

    #[test]
    fn performance_warnings_attach_to_their_function() {
        let out = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function 'k'\n\
ptxas info    : Function properties for k\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 168 registers, used 16 barriers, 64 bytes smem\n";
        let u = parse_ptxas_verbose(out);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].registers, 168);
        assert_eq!(u[0].performance_warnings.len(), 1);
        assert!(u[0].performance_warnings[0].contains("C7514"));
    }

    /// Real `ptxas -v -arch=sm_90a -maxrregcount=32` output (CUDA 13.0.88) for
    /// a kernel calling a non-inlined device function and a kernel that spills.
    const SPILLING: &str = "\
ptxas info    : Overriding maximum register limit 256 for 'calls' with  32 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'pressure' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'calls' for 'sm_90a'
ptxas info    : Function properties for calls
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 2.390 ms
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'pressure' for 'sm_90a'
ptxas info    : Function properties for pressure
    6432 bytes stack frame, 15108 bytes spill stores, 18120 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 6432 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 3070.150 ms
";

    /// Real `ptxas -v -arch=sm_80` output (CUDA 13.0.88) for the test kernels.
    const CLEAN: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'to_bf16' for 'sm_80'
ptxas info    : Function properties for to_bf16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 372 bytes cmem[0]
ptxas info    : Compile time = 1.978 ms
ptxas info    : Compiling entry function 'mma_bf16_m16n8k16' for 'sm_80'
ptxas info    : Function properties for mma_bf16_m16n8k16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 376 bytes cmem[0]
ptxas info    : Compile time = 1.640 ms
";

    #[test]
    fn spills_shared_memory_and_device_functions() {
        let u = parse_ptxas_verbose(SPILLING);
        assert_eq!(u.len(), 2, "{u:?}");
        assert_eq!(
            u[0],
            ResourceUsage {
                function: "calls".into(),
                arch: "sm_90a".into(),
                registers: 8,
                ..ResourceUsage::default()
            }
        );
        assert_eq!(
            u[1],
            ResourceUsage {
                function: "pressure".into(),
                arch: "sm_90a".into(),
                registers: 32,
                stack_frame_bytes: 6432,
                spill_store_bytes: 15108,
                spill_load_bytes: 18120,
                shared_bytes: 4096,
                barriers: 1,
                performance_warnings: Vec::new(),
            }
        );
        assert!(u[1].spills() && !u[0].spills());
    }

    #[test]
    fn clean_kernels() {
        let u = parse_ptxas_verbose(CLEAN);
        let names: Vec<_> = u
            .iter()
            .map(|u| (u.function.as_str(), u.registers))
            .collect();
        assert_eq!(names, [("to_bf16", 8), ("mma_bf16_m16n8k16", 16)]);
        assert!(
            u.iter()
                .all(|u| !u.spills() && u.shared_bytes == 0 && u.arch == "sm_80")
        );
    }

    #[test]
    fn unrelated_text_gives_nothing() {
        assert!(parse_ptxas_verbose("").is_empty());
        assert!(parse_ptxas_verbose("ptxas fatal   : Unresolved extern function 'f'").is_empty());
    }
}
