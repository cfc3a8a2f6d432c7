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

use core::fmt;

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
    /// The block ends before its header or its symbols do.
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

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
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
        if bytes.len() < LAUNCH_HEADER {
            return Err(truncated(LAUNCH_HEADER));
        }
        let version = u32_at(bytes, 4);
        if version != LAUNCH_VERSION {
            return Err(LaunchError::BadVersion(version));
        }
        let count = u32_at(bytes, 8);
        if count as usize > MAX_SYMBOLS {
            return Err(LaunchError::TooManySymbols { count });
        }
        let count = count as usize;
        let needed = LAUNCH_HEADER + 8 * count;
        if bytes.len() < needed {
            return Err(truncated(needed));
        }
        let mut values = [0i64; MAX_SYMBOLS];
        for (i, v) in values[..count].iter_mut().enumerate() {
            let at = LAUNCH_HEADER + 8 * i;
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            *v = i64::from_le_bytes(b);
        }
        let symbols = Symbols::new(&values[..count]).ok_or(LaunchError::TooManySymbols {
            count: count as u32,
        })?;
        let threads = match u32_at(bytes, 12) {
            0 => None,
            n => Some(n as usize),
        };
        let field = &bytes[16..16 + POLICY_FIELD];
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
    /// is too short.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let count = self.symbols.len();
        let len = LAUNCH_HEADER + 8 * count;
        let out = out.get_mut(..len)?;
        out.fill(0);
        out[..4].copy_from_slice(&LAUNCH_MAGIC);
        out[4..8].copy_from_slice(&LAUNCH_VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&(count as u32).to_le_bytes());
        let threads = self.threads.unwrap_or(0) as u32;
        out[12..16].copy_from_slice(&threads.to_le_bytes());
        if let Some(policy) = self.policy {
            let name = policy.name().as_bytes();
            out[16..16 + name.len()].copy_from_slice(name);
        }
        for i in 0..count {
            let at = LAUNCH_HEADER + 8 * i;
            let v = self.symbols.get(i).unwrap_or(0);
            out[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(symbols: &[i64], threads: u32, policy: &str) -> std::vec::Vec<u8> {
        let mut b = std::vec![0u8; LAUNCH_HEADER + 8 * symbols.len()];
        b[..4].copy_from_slice(b"WSPL");
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&(symbols.len() as u32).to_le_bytes());
        b[12..16].copy_from_slice(&threads.to_le_bytes());
        b[16..16 + policy.len()].copy_from_slice(policy.as_bytes());
        for (i, v) in symbols.iter().enumerate() {
            b[32 + 8 * i..40 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
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
