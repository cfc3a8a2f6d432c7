//! CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) over a table.

const fn make_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static TABLE: [u32; 256] = make_table();

/// Byte range of the checksum field inside the header.
pub const CHECKSUM_FIELD: core::ops::Range<usize> = 20..24;

/// CRC-32 of `bytes`, reading the header's checksum field as zero.
pub fn table_checksum(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for (i, &b) in bytes.iter().enumerate() {
        let b = if CHECKSUM_FIELD.contains(&i) { 0 } else { b };
        crc = TABLE[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
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
