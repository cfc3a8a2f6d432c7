//! The table parser and validator on arbitrary bytes, as given and with the
//! checksum resealed (so that mutations of a valid table reach the
//! validator past the checksum). A table that parses is then read the way
//! the runtime reads it: every task's arguments, its spec and tile views.
#![no_main]

use device_runtime::abi::{check_region, table_len, Region, Table, CHECKSUM_FIELD};
use device_runtime::expand::TaskSpec;
use libfuzzer_sys::fuzz_target;

fn read_all(table: &Table<'_>) {
    for (i, task) in table.tasks().iter().enumerate() {
        let spec = TaskSpec::of_task(table, i);
        assert_eq!(spec.args().len(), table.task_args(task).len());
        for a in table.task_args(task) {
            let tensor = &table.tensors()[a.tensor.get() as usize];
            let region = Region::of(a);
            check_region(tensor, &region).expect("a parsed table's regions are valid");
            // A scratch tensor has no arena bytes: its storage is taken
            // from the heap ring at run time.
            if tensor.is_scratch() {
                continue;
            }
            let bytes = Table::tensor_bytes(tensor).expect("a parsed tensor has a byte range");
            assert!(bytes.end <= table.arena_size());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = Table::parse(data) {
        read_all(&table);
    }
    let Ok(total) = table_len(data) else { return };
    if total > data.len() || total < CHECKSUM_FIELD.end {
        return;
    }
    let mut sealed = data[..total].to_vec();
    host_tools::table::seal(&mut sealed);
    if let Ok(table) = Table::parse(&sealed) {
        read_all(&table);
    }
});
