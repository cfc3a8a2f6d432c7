//! CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) over a table.

/// Byte range of the checksum field inside the header.
pub const CHECKSUM_FIELD: core::ops::Range<usize> = 20..24;

/// CRC-32 of `bytes`, reading the header's checksum field as zero.
///
/// `crc32fast` (slicing by 16 bytes without `std`, about eight times
/// fewer instructions than a byte at a time): a table of a million tasks is
/// tens of megabytes, which the device checks before it runs.
pub fn table_checksum(bytes: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    let field = CHECKSUM_FIELD.start.min(bytes.len())..CHECKSUM_FIELD.end.min(bytes.len());
    crc.update(&bytes[..field.start]);
    crc.update(&[0; CHECKSUM_FIELD.end - CHECKSUM_FIELD.start][..field.len()]);
    crc.update(&bytes[field.end..]);
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use super::{table_checksum, CHECKSUM_FIELD};

    /// Published CRC-32/ISO-HDLC values (the catalogue's check value for
    /// "123456789", and the common test strings), all shorter than the
    /// checksum field's offset, so that they are plain CRC-32.
    #[test]
    fn matches_published_crc32_vectors() {
        for (input, crc) in [
            (&b""[..], 0x0000_0000),
            (b"a", 0xE8B7_BE43),
            (b"abc", 0x3524_41C2),
            (b"123456789", 0xCBF4_3926),
            (b"message digest", 0x2015_9D7F),
        ] {
            assert!(input.len() <= CHECKSUM_FIELD.start);
            assert_eq!(table_checksum(input), crc, "{:?}", input);
        }
    }

    /// Bytes 20..24 (the checksum field) count as zero whatever they hold:
    /// the 43-byte pangram, whose CRC-32 is 0x414FA339, checks as the
    /// pangram with those four bytes zeroed (0x0FDA9799, from zlib's crc32).
    #[test]
    fn reads_the_checksum_field_as_zero() {
        let mut text = *b"The quick brown fox jumps over the lazy dog";
        let with_field = table_checksum(&text);
        assert_eq!(with_field, 0x0FDA_9799);
        text[CHECKSUM_FIELD].copy_from_slice(&[0; 4]);
        assert_eq!(table_checksum(&text), with_field);
        text[CHECKSUM_FIELD].copy_from_slice(&0x414F_A339u32.to_le_bytes());
        assert_eq!(table_checksum(&text), with_field);
        // A byte outside the field counts.
        text[24] ^= 1;
        assert_ne!(table_checksum(&text), with_field);
    }
}
