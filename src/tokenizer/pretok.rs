//! Pre-tokenizer splits for byte-level BPE, ported from llama.cpp's `unicode.cpp`.
//!
//! llama.cpp runs a list of regexes one after the other, each splitting the pieces the
//! previous one produced (`unicode_regex_split`); a piece's ends are hard boundaries for the
//! next regex (look-aheads do not see past them). The common regexes have hand-written
//! implementations there (`unicode_regex_split_custom_*`) whose results differ from a real
//! regex engine in corner cases, so they are ported here line by line, and codepoint classes
//! come from llama.cpp's own table ([`super::unicode_data`]).

use super::unicode::Flags;

/// One of llama.cpp's pre-tokenizer regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// `\p{N}`: every number codepoint on its own (llama.cpp runs it with `std::regex` over
    /// a text where each codepoint is collapsed to one byte of its class).
    Digit,
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    /// (`unicode_regex_split_custom_gpt2`).
    Gpt2,
    /// `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|
    /// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (`unicode_regex_split_custom_llama3`).
    Llama3,
    /// As [`Split::Llama3`] with `\p{N}` instead of `\p{N}{1,3}`
    /// (`unicode_regex_split_custom_qwen2`).
    Qwen2,
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

/// Splits `text` with `splits` in order; returns the pieces (not byte-encoded).
pub(crate) fn split<'a>(text: &'a str, splits: &[Split]) -> Vec<&'a str> {
    let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
    let mut offsets = vec![cpts.len()];
    for s in splits {
        offsets = match s {
            Split::Digit => split_digit(&cpts, &offsets),
            Split::Gpt2 => split_gpt2(&cpts, &offsets),
            Split::Llama3 => split_llama3(&cpts, &offsets, true),
            Split::Qwen2 => split_llama3(&cpts, &offsets, false),
        };
    }
    // Codepoint lengths to byte slices.
    let mut words = Vec::with_capacity(offsets.len());
    let mut chars = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()));
    let mut start = chars.next().unwrap_or(0);
    for len in offsets {
        let mut end = start;
        for _ in 0..len {
            end = chars.next().unwrap_or(text.len());
        }
        words.push(&text[start..end]);
        start = end;
    }
    words
}

/// Cursor over one piece `[ini, end)` of the codepoints: positions outside it read as
/// [`OUT_OF_RANGE`] / [`Flags::NONE`], as in llama.cpp.
struct Piece<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            Flags::of(self.cpts[pos])
        } else {
            Flags::NONE
        }
    }
}

/// Appends the token `[*prev_end, end)` (when not empty); returns its length.
fn add_token(out: &mut Vec<usize>, prev_end: &mut usize, end: usize) -> usize {
    let len = end - *prev_end;
    if len > 0 {
        out.push(len);
    }
    *prev_end = end;
    len
}

fn split_digit(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (ini, end) = (start, start + len);
        start = end;
        let mut run = 0;
        for &c in &cpts[ini..end] {
            if Flags::of(c).is_number() {
                if run > 0 {
                    out.push(run);
                    run = 0;
                }
                out.push(1);
            } else {
                run += 1;
            }
        }
        if run > 0 {
            out.push(run);
        }
    }
    out
}

fn is_contraction_letter(c: u32) -> bool {
    c == 's' as u32 || c == 't' as u32 || c == 'm' as u32 || c == 'd' as u32
}

fn is_contraction_pair(a: u32, b: u32) -> bool {
    let (r, v, l, e) = ('r' as u32, 'v' as u32, 'l' as u32, 'e' as u32);
    (b == e && (a == r || a == v)) || (a == l && b == l)
}

fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let p = Piece {
            cpts,
            ini: start,
            end: start + len,
        };
        start = p.end;
        let mut prev_end = p.ini;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);

            // 's|'t|'re|'ve|'m|'ll|'d
            if cpt == '\'' as u32 && pos + 1 < p.end {
                let next = p.cpt(pos + 1);
                if is_contraction_letter(next) {
                    pos += add_token(&mut out, &mut prev_end, pos + 2);
                    continue;
                }
                if pos + 2 < p.end && is_contraction_pair(next, p.cpt(pos + 2)) {
                    pos += add_token(&mut out, &mut prev_end, pos + 3);
                    continue;
                }
            }

            let space = cpt == ' ' as u32;
            let mut flags2 = if space { p.flags(pos + 1) } else { flags };
            // <space>?\p{L}+
            if flags2.is_letter() {
                pos += space as usize;
                while flags2.is_letter() {
                    pos += 1;
                    flags2 = p.flags(pos);
                }
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // <space>?\p{N}+
            if flags2.is_number() {
                pos += space as usize;
                while flags2.is_number() {
                    pos += 1;
                    flags2 = p.flags(pos);
                }
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(flags2) {
                pos += space as usize;
                while other(flags2) {
                    pos += 1;
                    flags2 = p.flags(pos);
                }
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }

            let mut n_ws = 0;
            while p.flags(pos + n_ws).is_whitespace() {
                n_ws += 1;
            }
            // \s+(?!\S)
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // \s+
            if n_ws > 0 {
                pos += n_ws;
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // no match
            pos += 1;
            add_token(&mut out, &mut prev_end, pos);
        }
    }
    out
}

fn to_lower_ascii(c: u32) -> u32 {
    // llama.cpp uses unicode_tolower here, but the result is only compared with "stmrevld",
    // and the only non-ASCII codepoints that lowercase to ASCII in its table are U+0130 -> 'i'
    // and U+212A -> 'k'; so lowering ASCII only is equivalent.
    if ('A' as u32..='Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// `unicode_regex_split_custom_llama3` (`digits_1_3`) and `_qwen2` (single digits).
fn split_llama3(cpts: &[u32], offsets: &[usize], digits_1_3: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let (cr, lf) = ('\r' as u32, '\n' as u32);
    for &len in offsets {
        let p = Piece {
            cpts,
            ini: start,
            end: start + len,
        };
        start = p.end;
        let mut prev_end = p.ini;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);

            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if cpt == '\'' as u32 && pos + 1 < p.end {
                let next = to_lower_ascii(p.cpt(pos + 1));
                if is_contraction_letter(next) {
                    pos += add_token(&mut out, &mut prev_end, pos + 2);
                    continue;
                }
                if pos + 2 < p.end && is_contraction_pair(next, to_lower_ascii(p.cpt(pos + 2))) {
                    pos += add_token(&mut out, &mut prev_end, pos + 3);
                    continue;
                }
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == cr || cpt == lf || flags.is_number())
                && (flags.is_letter() || p.flags(pos + 1).is_letter())
            {
                pos += 1;
                while p.flags(pos).is_letter() {
                    pos += 1;
                }
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }

            // \p{N}{1,3} or \p{N}
            if flags.is_number() {
                if digits_1_3 {
                    let mut ini = pos;
                    while p.flags(pos).is_number() {
                        pos += 1;
                        if pos - ini >= 3 {
                            add_token(&mut out, &mut prev_end, pos);
                            ini = pos;
                        }
                    }
                    add_token(&mut out, &mut prev_end, pos);
                } else {
                    pos += 1;
                    add_token(&mut out, &mut prev_end, pos);
                }
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let space = cpt == ' ' as u32;
            let mut flags2 = if space { p.flags(pos + 1) } else { flags };
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            // llama.cpp tests `flags` (not `flags2`) for "any flag" here: a space at the end
            // of a piece enters this branch (and becomes a token on its own either way).
            if !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number()) && flags.any()
            {
                pos += space as usize;
                while other(flags2) {
                    pos += 1;
                    flags2 = p.flags(pos);
                }
                let mut c2 = p.cpt(pos);
                while c2 == cr || c2 == lf {
                    pos += 1;
                    c2 = p.cpt(pos);
                }
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }

            let mut n_ws = 0;
            let mut last_end_rn = 0;
            while p.flags(pos + n_ws).is_whitespace() {
                let c2 = p.cpt(pos + n_ws);
                if c2 == cr || c2 == lf {
                    last_end_rn = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            // \s*[\r\n]+
            if last_end_rn > 0 {
                pos = last_end_rn;
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // \s+(?!\S)
            if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // \s+
            if n_ws > 0 {
                pos += n_ws;
                add_token(&mut out, &mut prev_end, pos);
                continue;
            }
            // no match
            pos += 1;
            add_token(&mut out, &mut prev_end, pos);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm(text: &str) -> Vec<&str> {
        split(text, &[Split::Digit, Split::Gpt2])
    }

    #[test]
    fn gpt2_basics() {
        assert_eq!(smollm("Hello world"), ["Hello", " world"]);
        assert_eq!(smollm("a  b"), ["a", " ", " b"]);
        assert_eq!(smollm("x   "), ["x", "   "]);
        assert_eq!(smollm("I'm"), ["I", "'m"]);
        assert_eq!(smollm("\tfoo"), ["\t", "foo"]);
        assert_eq!(smollm(""), Vec::<&str>::new());
    }

    #[test]
    fn digits_are_single() {
        assert_eq!(smollm("abc123 4"), ["abc", "1", "2", "3", " ", "4"]);
        assert_eq!(smollm("½x"), ["½", "x"]);
    }

    #[test]
    fn llama3_digits() {
        assert_eq!(split("1234567", &[Split::Llama3]), ["123", "456", "7"]);
        assert_eq!(
            split("1234567", &[Split::Qwen2]),
            ["1", "2", "3", "4", "5", "6", "7"]
        );
        assert_eq!(
            split("Hi\n\n there", &[Split::Llama3]),
            ["Hi", "\n\n", " there"]
        );
    }
}
