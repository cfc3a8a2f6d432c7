//! A progress bar for long runs: tasks finished of those known, and the
//! rate, on standard error, once a run has taken [`DELAY`]; nothing when
//! standard error is not a terminal (`indicatif` draws nothing there, and
//! [`wanted`] tells callers not to count at all).

use std::fmt::Write;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use crate::record::Sink;

/// How long a run goes before the bar shows.
pub const DELAY: Duration = Duration::from_secs(1);
/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(100);

/// Whether a bar could show: standard error is a terminal.
pub fn wanted() -> bool {
    std::io::stderr().is_terminal()
}

/// Runs `run`, and after [`DELAY`] shows a bar of the tasks `sink` has
/// seen finish, of `total` if known, until `run` returns (then clears it).
pub fn with_progress<T>(sink: &Sink, total: Option<u64>, run: impl FnOnce() -> T) -> T {
    with_progress_after(DELAY, sink, total, run)
}

/// [`with_progress`] with the bar shown after `delay`.
fn with_progress_after<T>(
    delay: Duration,
    sink: &Sink,
    total: Option<u64>,
    run: impl FnOnce() -> T,
) -> T {
    let (ended, wait) = channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            // A run shorter than the delay ends the wait at once.
            if wait.recv_timeout(delay) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            let template = match total {
                Some(_) => "{elapsed_precise} [{bar:40}] {pos}/{len} tasks, {rate}",
                None => "{elapsed_precise} {spinner} {pos} tasks, {rate}",
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                let style = style.with_key("rate", |s: &ProgressState, w: &mut dyn Write| {
                    let _ = write!(w, "{:.0} tasks/s", s.per_sec());
                });
                bar.set_style(style.progress_chars("=> "));
            }
            loop {
                bar.set_position(sink.finished.load(Ordering::Relaxed));
                if wait.recv_timeout(TICK) != Err(RecvTimeoutError::Timeout) {
                    break;
                }
            }
            bar.finish_and_clear();
        });
        let out = run();
        drop(ended);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_short_run_neither_waits_for_the_bar_nor_loses_its_result() {
        let sink = Sink::new(false);
        let start = Instant::now();
        // A delay far longer than a thread's start and join takes, even on
        // a loaded host.
        let delay = Duration::from_secs(60);
        let out = with_progress_after(delay, &sink, Some(3), || 42);
        assert_eq!(out, 42);
        // The watcher ends as soon as the run does, not after the delay.
        assert!(start.elapsed() < delay / 2, "{:?}", start.elapsed());
    }
}
