//! Checks that what is written by hand about the QEMU machine agrees with
//! `device_runtime::abi::memory_map`, its one source: the cargo runner in
//! `.cargo/config.toml` and the memory map table in `linker/README.md`.

use device_runtime::abi::memory_map::{
    ARENA_ADDR, ARENA_MAX, CPUS, IMAGE_ADDR, LAUNCH_ADDR, RAM_END, RAM_MIB, RAM_START, STACKS_ADDR,
    STACK_SIZE, TABLE_ADDR, TABLE_MAX,
};

use crate::workspace_root;

fn read(path: &str) -> String {
    let path = workspace_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `0x4800_0000`: hex digits grouped by four, as the docs write addresses.
fn grouped(addr: usize) -> String {
    let digits = format!("{addr:x}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 4 == 0 {
            out.push('_');
        }
        out.push(c);
    }
    format!("0x{out}")
}

/// The quoted strings of the `runner = [...]` array under
/// `[target.aarch64-unknown-none]`.
fn runner_args(config: &str) -> Vec<String> {
    let section = config
        .split("[target.aarch64-unknown-none]")
        .nth(1)
        .expect("a [target.aarch64-unknown-none] section");
    let array = section
        .split("runner = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("a runner array");
    array
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The value after `flag` in `args`.
fn after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

#[test]
fn addresses_are_written_grouped_by_four_digits() {
    assert_eq!(grouped(0x4800_0000), "0x4800_0000");
    assert_eq!(grouped(0x9_0000), "0x9_0000");
    assert_eq!(grouped(0x1000), "0x1000");
}

/// `cargo run --target aarch64-unknown-none` boots the machine the firmware
/// needs, as `cargo xtask qemu` does.
#[test]
fn the_cargo_runner_boots_the_firmwares_machine() {
    let args = runner_args(&read(".cargo/config.toml"));
    assert_eq!(after(&args, "-M"), Some("virt"), "{args:?}");
    assert_eq!(
        after(&args, "-smp"),
        Some(CPUS.to_string().as_str()),
        "{args:?}"
    );
    assert_eq!(
        after(&args, "-m"),
        Some(format!("{RAM_MIB}M").as_str()),
        "{args:?}"
    );
    assert_eq!(args.last().map(String::as_str), Some("-kernel"), "{args:?}");
}

/// The table and the loader lines of `linker/README.md` match the memory map.
#[test]
fn the_linker_readme_matches_the_memory_map() {
    let readme = read("linker/README.md");
    let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `0x")).collect();
    let windows = [
        RAM_START,
        IMAGE_ADDR,
        STACKS_ADDR,
        LAUNCH_ADDR,
        TABLE_ADDR,
        ARENA_ADDR,
    ];
    for addr in windows {
        let cell = format!("| `{}` |", grouped(addr));
        assert!(
            rows.iter().any(|r| r.starts_with(&cell)),
            "no row {cell} in linker/README.md"
        );
    }
    // Every row in RAM is one of the map's windows.
    for row in &rows {
        let addr = row[3..].split('`').next().unwrap();
        let value = usize::from_str_radix(&addr[2..].replace('_', ""), 16).unwrap();
        assert!(
            !(RAM_START..RAM_END).contains(&value) || windows.contains(&value),
            "linker/README.md: {addr} is not in the memory map"
        );
    }
    let facts = [
        format!("-smp {CPUS} -m {RAM_MIB}M"),
        format!("`{}`, {} MiB", grouped(RAM_END), ARENA_MAX >> 20),
        format!("at most {} MiB", TABLE_MAX >> 20),
        format!("{CPUS} CPUs x {} KiB", STACK_SIZE >> 10),
    ];
    for fact in facts {
        assert!(readme.contains(&fact), "linker/README.md lacks `{fact}`");
    }
    for addr in [TABLE_ADDR, ARENA_ADDR, LAUNCH_ADDR] {
        let loader = format!(",addr={addr:#x},force-raw=on");
        assert!(
            readme.contains(&loader),
            "linker/README.md lacks a loader line with `{loader}`"
        );
    }
}
