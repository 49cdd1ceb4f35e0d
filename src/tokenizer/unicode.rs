//! Codepoint classes and the GPT-2 byte-to-unicode mapping, as llama.cpp's `unicode.cpp`.

use super::unicode_data::{RANGES, WHITESPACE};

/// Category flags of a codepoint, as llama.cpp's `unicode_cpt_flags` (low 8 bits) plus
/// [`Flags::WHITESPACE`]. Every codepoint has exactly one category bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flags(u16);

// The full set of llama.cpp's category flags; the splitters use only some of them.
#[allow(dead_code)]
impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const WHITESPACE: u16 = 0x0100;

    /// The flags llama.cpp gives a position outside the current split (all zero).
    pub const NONE: Flags = Flags(0);

    pub fn of(cpt: u32) -> Flags {
        if cpt >= 0x110000 {
            return Flags(Self::UNDEFINED);
        }
        // The last entry whose start is <= cpt (RANGES[0] starts at 0).
        let i = RANGES.partition_point(|&r| (r >> 8) <= cpt) - 1;
        let mut f = (RANGES[i] & 0xFF) as u16;
        if WHITESPACE.binary_search(&cpt).is_ok() {
            f |= Self::WHITESPACE;
        }
        Flags(f)
    }

    pub fn bits(self) -> u16 {
        self.0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    pub fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    /// Any flag set: false only for [`Flags::NONE`] (outside the split).
    pub fn any(self) -> bool {
        self.0 != 0
    }
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in byte order (llama.cpp `unicode_byte_to_utf8_map`).
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(cp).expect("byte-level codepoints are below U+0200");
    }
    table
}

/// The inverse of [`byte_to_char_table`]: a char's byte, for U+0000..U+01FF.
pub(crate) fn char_to_byte_table() -> [Option<u8>; 512] {
    let mut inv = [None; 512];
    for (b, c) in byte_to_char_table().iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_ascii() {
        assert!(Flags::of('a' as u32).is_letter());
        assert!(Flags::of('7' as u32).is_number());
        assert!(Flags::of(' ' as u32).is_whitespace());
        assert!(Flags::of('\n' as u32).is_whitespace());
        assert!(Flags::of('!' as u32).is_punctuation());
        assert!(Flags::of('$' as u32).is_symbol());
        assert!(Flags::of(0x3000).is_whitespace());
        assert!(Flags::of(0x4F60).is_letter()); // 你
        assert!(Flags::of(0x00BD).is_number()); // ½
        assert!(Flags::of(0x0301).is_accent_mark());
        assert_eq!(Flags::of(0x10FFFF).bits(), Flags::UNDEFINED);
        assert_eq!(Flags::of(0x110000).bits(), Flags::UNDEFINED);
    }

    #[test]
    fn byte_table_round_trips() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        let inv = char_to_byte_table();
        for b in 0..=255u8 {
            assert_eq!(inv[t[b as usize] as usize], Some(b));
        }
        assert_eq!(inv.iter().filter(|x| x.is_some()).count(), 256);
    }
}
