//! The launch block: what a launch binds besides the table and the arena
//! (the program's symbols, the scheduler threads and the dispatch policy),
//! so that the same table bytes run with other values. Where there is no
//! launch argument pointer (the QEMU firmware), the host loads it at a fixed
//! address; all-zero memory there means "no launch block".
//!
//! Layout (little-endian, [`LAUNCH_HEADER`] bytes, then the symbols):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic [`LAUNCH_MAGIC`] (`WSPL`) |
//! | 4 | u32 version, [`LAUNCH_VERSION`] |
//! | 8 | u32 symbol count, at most [`MAX_SYMBOLS`] |
//! | 12 | u32 scheduler threads (0: the runner's default) |
//! | 16 | 16 bytes: dispatch policy name, NUL-padded (empty: the default) |
//! | 32 | i64 symbol values, `count` of them |
//!
//! [`LaunchHeader`] is the fixed part as a struct: [`Launch::parse`] reads
//! through it and [`encode_block`] (which hosts use) writes through it.

use core::fmt;

use zerocopy::little_endian::{I64, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::program::MAX_SYMBOLS;
use super::schedule::{PolicyError, PolicyKind};

/// The block's first four bytes.
pub const LAUNCH_MAGIC: [u8; 4] = *b"WSPL";
/// The layout this runtime reads.
pub const LAUNCH_VERSION: u32 = 1;
/// Bytes before the symbol values.
pub const LAUNCH_HEADER: usize = 32;
/// The largest block: the header and [`MAX_SYMBOLS`] values.
pub const LAUNCH_MAX: usize = LAUNCH_HEADER + 8 * MAX_SYMBOLS;
/// Bytes of the policy name field.
const POLICY_FIELD: usize = 16;

/// The block's fixed part as it lies in memory: little-endian fields, no
/// padding, any alignment. The symbol values (`I64`s) follow it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct LaunchHeader {
    /// [`LAUNCH_MAGIC`].
    pub magic: [u8; 4],
    /// [`LAUNCH_VERSION`].
    pub version: U32,
    /// How many symbol values follow, at most [`MAX_SYMBOLS`].
    pub symbols: U32,
    /// Scheduler threads; 0 leaves the choice to the runner.
    pub threads: U32,
    /// The dispatch policy's name, NUL-padded; empty leaves the choice to the runner.
    pub policy: [u8; POLICY_FIELD],
}

const _: () = assert!(core::mem::size_of::<LaunchHeader>() == LAUNCH_HEADER);

/// Writes a launch block binding `symbols`, with `threads` scheduler
/// threads (0: the runner's default) and the dispatch policy named
/// `policy` (empty: the default), at the start of `out`; returns its
/// length. The name is not looked up (the device checks it), so a host can
/// write a block for a build with other policies.
///
/// Errors: more than [`MAX_SYMBOLS`] symbols
/// ([`TooManySymbols`](LaunchError::TooManySymbols)), a name that is not
/// ASCII without NUL or longer than 16 bytes
/// ([`BadPolicyName`](LaunchError::BadPolicyName)), or `out` shorter than
/// the block ([`Truncated`](LaunchError::Truncated); [`LAUNCH_MAX`] bytes
/// always suffice).
pub fn encode_block(
    symbols: &[i64],
    threads: u32,
    policy: &str,
    out: &mut [u8],
) -> Result<usize, LaunchError> {
    if symbols.len() > MAX_SYMBOLS {
        return Err(LaunchError::TooManySymbols {
            count: u32::try_from(symbols.len()).unwrap_or(u32::MAX),
        });
    }
    let name = policy.as_bytes();
    if name.len() > POLICY_FIELD || !policy.is_ascii() || name.contains(&0) {
        return Err(LaunchError::BadPolicyName);
    }
    let mut header = LaunchHeader {
        magic: LAUNCH_MAGIC,
        version: U32::new(LAUNCH_VERSION),
        symbols: U32::new(symbols.len() as u32),
        threads: U32::new(threads),
        policy: [0; POLICY_FIELD],
    };
    header.policy[..name.len()].copy_from_slice(name);
    let len = LAUNCH_HEADER + 8 * symbols.len();
    let out_len = out.len();
    let block = out.get_mut(..len).ok_or(LaunchError::Truncated {
        needed: len,
        len: out_len,
    })?;
    let (head, values) = block.split_at_mut(LAUNCH_HEADER);
    head.copy_from_slice(header.as_bytes());
    for (slot, &v) in values.chunks_exact_mut(8).zip(symbols) {
        slot.copy_from_slice(I64::new(v).as_bytes());
    }
    Ok(len)
}

/// The symbols bound at a launch: up to
/// [`MAX_SYMBOLS`] signed values,
/// numbered from 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Symbols {
    values: [i64; MAX_SYMBOLS],
    len: usize,
}

impl Symbols {
    /// Binds symbols `0 .. values.len()`; `None` if there are more than
    /// [`MAX_SYMBOLS`].
    pub fn new(values: &[i64]) -> Option<Self> {
        let mut symbols = Symbols::default();
        symbols
            .values
            .get_mut(..values.len())?
            .copy_from_slice(values);
        symbols.len = values.len();
        Some(symbols)
    }

    /// Symbol `index`, if bound.
    pub fn get(&self, index: usize) -> Option<i64> {
        self.values[..self.len].get(index).copied()
    }

    /// Number of symbols bound.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no symbol is bound.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A parsed launch block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The program's symbols.
    pub symbols: Symbols,
    /// Scheduler threads; `None` leaves the choice to the runner.
    pub threads: Option<usize>,
    /// The dispatch policy; `None` leaves the choice to the runner.
    pub policy: Option<PolicyKind>,
}

/// Why a launch block was refused.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchError {
    /// The first four bytes are neither [`LAUNCH_MAGIC`] nor zero.
    BadMagic([u8; 4]),
    /// A layout version other than [`LAUNCH_VERSION`].
    BadVersion(u32),
    /// More symbols than [`MAX_SYMBOLS`].
    TooManySymbols { count: u32 },
    /// The block ends before its header or its symbols do (or, for
    /// [`encode_block`], the buffer is too short for them).
    Truncated { needed: usize, len: usize },
    /// The policy name is not NUL-padded ASCII.
    BadPolicyName,
    /// The policy is unknown or not in this build.
    Policy(PolicyError),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid launch block: ")?;
        match *self {
            LaunchError::BadMagic(m) => write!(
                f,
                "magic {:02x} {:02x} {:02x} {:02x}, expected \"WSPL\"",
                m[0], m[1], m[2], m[3]
            ),
            LaunchError::BadVersion(v) => {
                write!(f, "version {v}, this runtime reads {LAUNCH_VERSION}")
            }
            LaunchError::TooManySymbols { count } => {
                write!(f, "{count} symbols, at most {MAX_SYMBOLS}")
            }
            LaunchError::Truncated { needed, len } => {
                write!(f, "{len} bytes, its fields need {needed}")
            }
            LaunchError::BadPolicyName => f.write_str("the policy name is not NUL-padded ASCII"),
            LaunchError::Policy(e) => write!(f, "policy: {e}"),
        }
    }
}

impl Launch {
    /// Parses the block at the start of `bytes` (which may run on past it).
    /// `Ok(None)` if the magic is zero: no block was loaded.
    pub fn parse(bytes: &[u8]) -> Result<Option<Launch>, LaunchError> {
        let truncated = |needed| LaunchError::Truncated {
            needed,
            len: bytes.len(),
        };
        let magic: [u8; 4] = bytes
            .get(..4)
            .ok_or(truncated(4))?
            .try_into()
            .map_err(|_| truncated(4))?;
        if magic == [0; 4] {
            return Ok(None);
        }
        if magic != LAUNCH_MAGIC {
            return Err(LaunchError::BadMagic(magic));
        }
        let (header, rest) =
            LaunchHeader::ref_from_prefix(bytes).map_err(|_| truncated(LAUNCH_HEADER))?;
        let version = header.version.get();
        if version != LAUNCH_VERSION {
            return Err(LaunchError::BadVersion(version));
        }
        let count = header.symbols.get();
        if count as usize > MAX_SYMBOLS {
            return Err(LaunchError::TooManySymbols { count });
        }
        let count = count as usize;
        let (stored, _) = <[I64]>::ref_from_prefix_with_elems(rest, count)
            .map_err(|_| truncated(LAUNCH_HEADER + 8 * count))?;
        let mut values = [0i64; MAX_SYMBOLS];
        for (v, stored) in values.iter_mut().zip(stored) {
            *v = stored.get();
        }
        let symbols = Symbols::new(&values[..count]).ok_or(LaunchError::TooManySymbols {
            count: count as u32,
        })?;
        let threads = match header.threads.get() {
            0 => None,
            n => Some(n as usize),
        };
        let field = &header.policy;
        let len = field.iter().position(|&b| b == 0).unwrap_or(POLICY_FIELD);
        if field[len..].iter().any(|&b| b != 0) || !field[..len].is_ascii() {
            return Err(LaunchError::BadPolicyName);
        }
        let policy = match core::str::from_utf8(&field[..len]) {
            Ok("") => None,
            Ok(name) => Some(PolicyKind::parse(name).map_err(LaunchError::Policy)?),
            Err(_) => return Err(LaunchError::BadPolicyName),
        };
        Ok(Some(Launch {
            symbols,
            threads,
            policy,
        }))
    }

    /// Writes the block into `out` and returns its length; `None` if `out`
    /// is too short. (See [`encode_block`].)
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let mut values = [0i64; MAX_SYMBOLS];
        let count = self.symbols.len().min(MAX_SYMBOLS);
        for (i, v) in values[..count].iter_mut().enumerate() {
            *v = self.symbols.get(i).unwrap_or(0);
        }
        let threads = u32::try_from(self.threads.unwrap_or(0)).ok()?;
        let policy = self.policy.map_or("", PolicyKind::name);
        encode_block(&values[..count], threads, policy, out).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(symbols: &[i64], threads: u32, policy: &str) -> std::vec::Vec<u8> {
        let mut b = [0u8; LAUNCH_MAX];
        let len = encode_block(symbols, threads, policy, &mut b).unwrap();
        b[..len].to_vec()
    }

    /// The wire layout, written out by hand from the table in the module
    /// docs: the encoder matches it and the parser reads it.
    #[test]
    fn the_layout_is_the_documented_one() {
        // Round-robin: the one policy every build has.
        #[rustfmt::skip]
        let bytes: [u8; 48] = [
            b'W', b'S', b'P', b'L', 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0,
            b'r', b'o', b'u', b'n', b'd', b'-', b'r', b'o', b'b', b'i', b'n', 0, 0, 0, 0, 0,
            5, 0, 0, 0, 0, 0, 0, 0, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        assert_eq!(block(&[5, -7], 3, "round-robin"), bytes);
        let launch = Launch::parse(&bytes).unwrap().unwrap();
        assert_eq!(launch.symbols, Symbols::new(&[5, -7]).unwrap());
        assert_eq!(launch.threads, Some(3));
        assert_eq!(launch.policy, Some(PolicyKind::RoundRobin));
    }

    #[test]
    fn the_encoder_refuses_what_the_layout_cannot_hold() {
        let mut out = [0u8; LAUNCH_MAX];
        assert_eq!(
            encode_block(&[0; MAX_SYMBOLS + 1], 0, "", &mut out),
            Err(LaunchError::TooManySymbols { count: 17 })
        );
        for name in ["seventeen-letters", "caf\u{e9}", "a\0b"] {
            assert_eq!(
                encode_block(&[], 0, name, &mut out),
                Err(LaunchError::BadPolicyName),
                "{name:?}"
            );
        }
        assert_eq!(
            encode_block(&[1, 2], 0, "", &mut out[..40]),
            Err(LaunchError::Truncated {
                needed: 48,
                len: 40
            })
        );
        // Sixteen letters fill the field without a NUL, and read back.
        let len = encode_block(&[], 0, "sixteen-letters!", &mut out).unwrap();
        assert_eq!(&out[16..32], b"sixteen-letters!");
        assert_eq!(
            Launch::parse(&out[..len]),
            Err(LaunchError::Policy(PolicyError::Unknown))
        );
    }

    #[test]
    fn blocks_round_trip_and_zeroes_mean_none() {
        let b = block(&[3, -7], 0, "");
        let launch = Launch::parse(&b).unwrap().unwrap();
        assert_eq!(launch.symbols, Symbols::new(&[3, -7]).unwrap());
        assert_eq!((launch.threads, launch.policy), (None, None));
        let mut out = [0xffu8; LAUNCH_MAX];
        let len = launch.write(&mut out).unwrap();
        assert_eq!(&out[..len], &b[..]);
        let with = block(&[], 2, "round-robin");
        let launch = Launch::parse(&with).unwrap().unwrap();
        assert_eq!(launch.threads, Some(2));
        assert_eq!(launch.policy, Some(PolicyKind::RoundRobin));
        assert_eq!(Launch::parse(&[0; LAUNCH_MAX]), Ok(None));
    }

    #[test]
    fn malformed_blocks_say_why() {
        let mut bad = block(&[1], 0, "");
        bad[0] = b'X';
        let e = Launch::parse(&bad).unwrap_err();
        assert_eq!(e, LaunchError::BadMagic(*b"XSPL"));
        assert!(std::format!("{e}").contains("expected \"WSPL\""));
        let mut bad = block(&[1], 0, "");
        bad[8] = 17;
        let e = Launch::parse(&bad).unwrap_err();
        assert_eq!(e, LaunchError::TooManySymbols { count: 17 });
        assert!(std::format!("{e}").contains("17 symbols, at most 16"));
        let mut bad = block(&[1], 0, "");
        bad[4] = 2;
        assert_eq!(Launch::parse(&bad), Err(LaunchError::BadVersion(2)));
        let b = block(&[1, 2], 0, "");
        assert_eq!(
            Launch::parse(&b[..40]),
            Err(LaunchError::Truncated {
                needed: 48,
                len: 40
            })
        );
        let e = Launch::parse(&block(&[], 0, "fastest")).unwrap_err();
        assert_eq!(e, LaunchError::Policy(PolicyError::Unknown));
        let mut bad = block(&[], 0, "hash");
        bad[30] = b'x';
        assert_eq!(Launch::parse(&bad), Err(LaunchError::BadPolicyName));
    }
}
