//! The completion ring ([`Ring`], a scheduler thread -> the dispatcher)
//! against `heapless::spsc::Queue`: values through a ring of the same
//! capacity, (1) pushed and popped in turn on one thread, (2) from a
//! producer thread to a consumer thread (both spin; needs two host cores).
//! Prints the median over 7 runs of nanoseconds per value.
//!
//! Run: `cargo bench -p device-runtime --bench ring`
//! (`WSP_BENCH_SMOKE=1`: 100,000 values, for CI).

use std::hint::black_box;
use std::time::Instant;

use device_runtime::sched::ring::Ring;
use heapless::spsc::Queue;

/// The completion ring's capacity (`DONE_RING` = 2 * `TASK_WINDOW`).
const N: usize = 512;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ring_one_thread(values: u64) -> f64 {
    let ring = Ring::<N>::new();
    let start = Instant::now();
    let mut sum = 0;
    for v in 0..values {
        assert!(ring.push(v));
        sum += ring.pop().unwrap();
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / values as f64
}

fn queue_one_thread(values: u64) -> f64 {
    // heapless' queue holds N - 1 values: N + 1 slots hold as many as the ring.
    let mut queue = Queue::<u64, { N + 1 }>::new();
    let (mut tx, mut rx) = queue.split();
    let start = Instant::now();
    let mut sum = 0;
    for v in 0..values {
        assert!(tx.enqueue(v).is_ok());
        sum += rx.dequeue().unwrap();
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / values as f64
}

fn ring_two_threads(values: u64) -> f64 {
    let ring = Ring::<N>::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for v in 0..values {
                while !ring.push(v) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0;
        while next < values {
            match ring.pop() {
                Some(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
    });
    start.elapsed().as_nanos() as f64 / values as f64
}

fn queue_two_threads(values: u64) -> f64 {
    let mut queue = Queue::<u64, { N + 1 }>::new();
    let (mut tx, mut rx) = queue.split();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for v in 0..values {
                while tx.enqueue(v).is_err() {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0;
        while next < values {
            match rx.dequeue() {
                Some(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
    });
    start.elapsed().as_nanos() as f64 / values as f64
}

fn main() {
    let values = if std::env::var_os("WSP_BENCH_SMOKE").is_some() {
        100_000
    } else {
        5_000_000
    };
    type Run = fn(u64) -> f64;
    let figures: [(&str, Run); 4] = [
        ("Ring, one thread", ring_one_thread),
        ("heapless Queue, one thread", queue_one_thread),
        ("Ring, two threads", ring_two_threads),
        ("heapless Queue, two threads", queue_two_threads),
    ];
    println!("{values} values through a ring of {N}, ns per value (median of 7):");
    for (name, run) in figures {
        let ns = median((0..7).map(|_| run(values)).collect());
        println!("  {name:<30} {ns:.2}");
    }
}
