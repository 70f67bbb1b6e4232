//! Timing launches with CUDA events: GPU time, not host time, and the median
//! of many repetitions, as the benchmark format (design §11) asks.

use cudarc::driver::sys::CUevent_flags;

use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

/// Milliseconds per repetition.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Every repetition, in order.
    pub samples_ms: Vec<f64>,
}

impl Timing {
    /// Summarises samples; `None` when there are none.
    pub fn from_samples(samples_ms: Vec<f64>) -> Option<Timing> {
        let mut sorted = samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median_ms = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Timing {
            median_ms,
            min_ms: sorted[0],
            max_ms: sorted[n - 1],
            samples_ms,
        })
    }
}

/// Runs `launch` `warmup` times untimed, then `reps` times, each between two
/// events on `stream`, and reports the GPU time of each repetition.
/// `launch` must queue its work on `stream`.
pub fn time_ms(
    stream: &Stream,
    warmup: usize,
    reps: usize,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    if reps == 0 {
        return Err(RuntimeError::Invalid(
            "time_ms needs at least one repetition".into(),
        ));
    }
    for _ in 0..warmup {
        launch()?;
    }
    // Events are made up front so that creating them never falls inside a
    // timed interval.
    let ctx = stream.cuda().context();
    let pairs = (0..reps)
        .map(|_| {
            let new = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
            Ok((new()?, new()?))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(RuntimeError::driver("cuEventCreate"))?;
    stream.synchronize()?;
    for (start, end) in &pairs {
        start
            .record(stream.cuda())
            .map_err(RuntimeError::driver("cuEventRecord"))?;
        launch()?;
        end.record(stream.cuda())
            .map_err(RuntimeError::driver("cuEventRecord"))?;
    }
    stream.synchronize()?;
    let samples = pairs
        .iter()
        .map(|(start, end)| {
            start
                .elapsed_ms(end)
                .map(f64::from)
                .map_err(RuntimeError::driver("cuEventElapsedTime"))
        })
        .collect::<Result<Vec<_>>>()?;
    Timing::from_samples(samples).ok_or_else(|| RuntimeError::Invalid("no timing samples".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        let t = Timing::from_samples(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (2.0, 1.0, 3.0));
        assert_eq!(t.samples_ms, [3.0, 1.0, 2.0]);
        let t = Timing::from_samples(vec![4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(t.median_ms, 2.5);
        assert!(Timing::from_samples(Vec::new()).is_none());
    }
}
