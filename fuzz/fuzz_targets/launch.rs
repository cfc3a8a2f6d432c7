//! The launch block parser on arbitrary bytes: an error or a block, never a
//! panic; a parsed block writes back to bytes that parse to the same block.
#![no_main]

use device_runtime::abi::launch::{Launch, LAUNCH_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(launch)) = Launch::parse(data) {
        let mut out = [0u8; LAUNCH_MAX];
        let len = launch
            .write(&mut out)
            .expect("a parsed block fits the largest one");
        assert_eq!(Launch::parse(&out[..len]), Ok(Some(launch)));
    }
});
