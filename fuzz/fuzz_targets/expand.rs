//! The program validator and the device's expander: the input, resealed,
//! is parsed as a table; if it parses, its program is expanded against a
//! fake run whose answers (pending writers, finished iterations, loaded
//! values) vary from call to call, for a bounded number of steps. Every
//! task the expander emits must name a valid region of a real tensor.
#![no_main]

use device_runtime::abi::CHECKSUM_FIELD;
use device_runtime::abi::{check_region, table_len, Region, Table, TensorDesc};
use device_runtime::expand::{Context, Expander, Step};
use libfuzzer_sys::fuzz_target;

/// Steps per input: enough for the corpus's programs, bounded for speed.
const MAX_STEPS: usize = 4096;

struct FakeRun {
    next: u64,
    calls: u64,
}

impl Context for FakeRun {
    fn symbol(&self, index: usize) -> Option<i64> {
        [4, 1, 0, 7, 2, 3, 16, 5].get(index).copied()
    }
    fn next_task(&self) -> u64 {
        self.next
    }
    fn pending_writer(&mut self, _: u32, _: &Region) -> Option<u64> {
        self.calls += 1;
        (self.next > 0 && self.calls % 3 == 0).then(|| self.next - 1)
    }
    fn completed_since(&self, _: u64) -> bool {
        self.calls % 2 == 0
    }
    fn read_i32(&mut self, _: &TensorDesc, element: u64) -> i32 {
        self.calls += 1;
        match element % 7 {
            0 => -1,
            1 => i32::MAX,
            e => e as i32,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(total) = table_len(data) else { return };
    if total > data.len() || total < CHECKSUM_FIELD.end {
        return;
    }
    let mut sealed = data[..total].to_vec();
    host_tools::table::seal(&mut sealed);
    let Ok(table) = Table::parse(&sealed) else {
        return;
    };
    let mut expander = Expander::new(&table);
    let mut run = FakeRun {
        next: table.tasks().len() as u64,
        calls: 0,
    };
    for _ in 0..MAX_STEPS {
        match expander.step(&table, &mut run) {
            Ok(Step::Task(spec)) => {
                for a in spec.args() {
                    let tensor = &table.tensors()[a.tensor as usize];
                    assert!(check_region(tensor, &a.region).is_ok(), "{a:?}");
                }
                let _ = spec.kernel_args(&table, 0);
                run.next += 1;
            }
            Ok(Step::Done) | Err(_) => return,
            Ok(Step::Event { .. } | Step::Wait(_) | Step::Yield) => run.calls += 1,
        }
    }
});
