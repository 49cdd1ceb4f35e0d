//! SentencePiece-style tokenization (llama.cpp `llm_tokenizer_spm_session`): start from the
//! text's characters and repeatedly merge the adjacent pair whose concatenation is the
//! vocabulary token with the highest score (ties: the leftmost pair).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::bpe::{utf8_symbols, Symbol};

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order of llama.cpp's `llm_bigram_spm::comparator`: higher score first, then
    /// the smaller `left`.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// A token's id and score by text.
pub(crate) type Lookup<'a> = &'a dyn Fn(&[u8]) -> Option<(u32, f32)>;

/// Tokenizes `text` (spaces already escaped to U+2581). `lookup` gives a token's id and
/// score; `byte_token` the id for a byte that no token covers. Appends ids to `out`.
pub(crate) fn tokenize(
    text: &[u8],
    lookup: Lookup<'_>,
    byte_token: &dyn Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    let mut symbols = utf8_symbols(text);

    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let start = symbols[l].start;
        let size = symbols[l].len + symbols[r].len;
        if let Some((_, score)) = lookup(&text[start..start + size]) {
            heap.push(Bigram {
                left: l,
                right: r,
                score,
                size,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut heap, &symbols, Some(i - 1), Some(i));
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left, b.right);
        if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != b.size {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        symbols[l].next = symbols[r].next;
        if let Some(n) = symbols[r].next {
            symbols[n].prev = Some(l);
        }
        try_add(&mut heap, &symbols, symbols[l].prev, Some(l));
        try_add(&mut heap, &symbols, Some(l), symbols[l].next);
    }

    // llama.cpp's `resegment`: a symbol is a token, or (never merged, so a single character)
    // its bytes. Its `rev_merge` fallback only applies to a symbol that is not a token but
    // was formed by merging, which cannot happen: merges only ever form tokens.
    let mut i = if symbols.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match lookup(piece) {
            Some((id, _)) => out.push(id),
            None => {
                for &b in piece {
                    if let Some(id) = byte_token(b) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
