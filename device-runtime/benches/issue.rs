//! The issue protocol's round trip: one scheduler thread hands tiny tasks
//! (an ADD of one element) to one core thread through a [`CoreMailbox`],
//! (1) one task at a time: issue, wait for FIN, issue the next;
//! (2) double-buffered: the next task waits in the second payload buffer
//!     while the core runs the current one, so the core starts it without
//!     a round trip.
//! Needs two host cores (both threads spin). Prints the median over 7 runs
//! of nanoseconds per task and the ratio of the two.
//!
//! Run: `cargo bench -p device-runtime --bench issue`
//! (`WSP_BENCH_SMOKE=1`: 50,000 tasks, for CI).

use std::time::Instant;

use device_runtime::mailbox::{serve, Completion, CoreMailbox, IssuePort};
use wsp_ffi::{WspKernelArgs, WspKernelId_WSP_KERNEL_ADD as ADD, WspTensorView, DTYPE_F32};

fn check(completion: Option<Completion>) -> bool {
    match completion {
        Some(Completion::Done { .. }) => true,
        Some(Completion::Rejected) => panic!("the kernel refused its arguments"),
        Some(Completion::Failed { code }) => panic!("the kernel failed with code {code}"),
        None => {
            std::hint::spin_loop();
            false
        }
    }
}

fn wait(port: &mut IssuePort<'_>) {
    while !check(port.poll()) {}
}

/// Runs `tasks` tasks with at most `depth` in flight; ns per task.
fn run(tasks: u32, depth: usize) -> f64 {
    let mailbox = CoreMailbox::new();
    let mut data = [1.0f32, 2.0, 0.0];
    let base = data.as_mut_ptr() as u64;
    let view = |i: u64| WspTensorView {
        addr: base + 4 * i,
        rows: 1,
        cols: 1,
        row_stride: 1,
        dtype: DTYPE_F32,
    };
    let args = WspKernelArgs {
        num_tensors: 3,
        num_scalars: 0,
        tensors: [view(0), view(1), view(2), view(0)],
        scalars: [0; 4],
    };
    let elapsed = std::thread::scope(|s| {
        s.spawn(|| serve(&mailbox, std::hint::spin_loop));
        let mut port = mailbox.claim_issue().expect("a fresh mailbox");
        let start = Instant::now();
        for _ in 0..tasks {
            while port.pending() >= depth || !port.can_issue() {
                check(port.poll());
            }
            // SAFETY: `data` outlives every task (the scope drains them all
            // before it ends); the kernels, run one after another by the
            // core, write data[2], which this thread does not touch.
            assert!(unsafe { port.issue(ADD, &args) });
        }
        while port.pending() > 0 {
            wait(&mut port);
        }
        let elapsed = start.elapsed();
        mailbox.request_exit();
        elapsed
    });
    assert_eq!(data[2], 3.0);
    elapsed.as_nanos() as f64 / tasks as f64
}

fn median(mut f: impl FnMut() -> f64) -> f64 {
    let mut samples: Vec<f64> = (0..7).map(|_| f()).collect();
    samples.sort_by(f64::total_cmp);
    samples[3]
}

fn main() {
    let tasks = if std::env::var_os("WSP_BENCH_SMOKE").is_some() {
        50_000
    } else {
        200_000
    };
    let one = median(|| run(tasks, 1));
    let two = median(|| run(tasks, 2));
    println!("issue protocol, {tasks} one-element ADD tasks, 1 scheduler + 1 core thread:");
    println!("  one task at a time      {one:>7.1} ns/task");
    println!(
        "  double-buffered (ACK)   {two:>7.1} ns/task; {:.2}x faster",
        one / two
    );
}
