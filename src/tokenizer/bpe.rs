//! Byte-pair merging of one pre-tokenized word (llama.cpp `llm_tokenizer_bpe_session`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge ranks: `(left, right) -> rank` (the merge's index in `ggml.merges`; the first of
/// duplicate pairs wins, as `std::map::emplace`).
#[derive(Debug, Default)]
pub(crate) struct Ranks {
    map: HashMap<Vec<u8>, u32>,
}

fn pair_key(buf: &mut Vec<u8>, left: &[u8], right: &[u8]) {
    buf.clear();
    buf.extend_from_slice(&(left.len() as u32).to_le_bytes());
    buf.extend_from_slice(left);
    buf.extend_from_slice(right);
}

impl Ranks {
    pub fn insert(&mut self, left: &[u8], right: &[u8], rank: u32) {
        let mut key = Vec::with_capacity(4 + left.len() + right.len());
        pair_key(&mut key, left, right);
        self.map.entry(key).or_insert(rank);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, buf: &mut Vec<u8>, left: &[u8], right: &[u8]) -> Option<u32> {
        pair_key(buf, left, right);
        self.map.get(buf.as_slice()).copied()
    }
}

/// `(rank, left, right, left length, right length)`.
type Bigram = (u32, usize, usize, usize, usize);

/// One symbol of a merge session: a byte range of the text, linked to its neighbours.
#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) prev: Option<usize>,
    pub(crate) next: Option<usize>,
}

/// Splits `text` into one linked symbol per UTF-8 character (a truncated last character is
/// one symbol), the starting point of both BPE and SentencePiece merging.
pub(crate) fn utf8_symbols(text: &[u8]) -> Vec<Symbol> {
    let mut symbols: Vec<Symbol> = Vec::new();
    let mut offset = 0;
    while offset < text.len() {
        let len = utf8_len(text[offset]).min(text.len() - offset);
        let index = symbols.len();
        symbols.push(Symbol {
            start: offset,
            len,
            prev: index.checked_sub(1),
            next: None,
        });
        offset += len;
        if offset < text.len() {
            symbols[index].next = Some(index + 1);
        }
    }
    symbols
}

/// Splits `word` (already byte-encoded) into its final BPE symbols; appends each symbol's
/// byte range to `out`. With `whole_word`, the word is one symbol (llama.cpp's
/// `ignore_merges` when the word is itself a token).
pub(crate) fn merge_word(
    word: &[u8],
    ranks: &Ranks,
    whole_word: bool,
    out: &mut Vec<(usize, usize)>,
) {
    if whole_word {
        out.push((0, word.len()));
        return;
    }
    let mut symbols = utf8_symbols(word);

    // Min-heap on (rank, left); the lengths identify a stale entry (see below).
    let mut heap: BinaryHeap<Reverse<Bigram>> = BinaryHeap::new();
    let mut buf = Vec::new();
    let text = |s: &Symbol| &word[s.start..s.start + s.len];
    let mut push = |heap: &mut BinaryHeap<_>,
                    symbols: &[Symbol],
                    left: Option<usize>,
                    right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (sl, sr) = (&symbols[l], &symbols[r]);
        if let Some(rank) = ranks.get(&mut buf, text(sl), text(sr)) {
            heap.push(Reverse((rank, l, r, sl.len, sr.len)));
        }
    };
    for i in 1..symbols.len() {
        push(&mut heap, &symbols, Some(i - 1), Some(i));
    }
    while let Some(Reverse((_, l, r, llen, rlen))) = heap.pop() {
        // llama.cpp skips a bigram whose symbols were merged away or whose text changed;
        // symbols only grow, so "same text" is "same lengths".
        if symbols[l].len == 0
            || symbols[r].len == 0
            || symbols[l].len != llen
            || symbols[r].len != rlen
        {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        symbols[l].next = symbols[r].next;
        if let Some(n) = symbols[r].next {
            symbols[n].prev = Some(l);
        }
        push(&mut heap, &symbols, symbols[l].prev, Some(l));
        push(&mut heap, &symbols, Some(l), symbols[l].next);
    }
    for s in &symbols {
        if s.len > 0 {
            out.push((s.start, s.start + s.len));
        }
    }
}

/// llama.cpp `unicode_len_utf8`: the sequence length from a lead byte (1 for a stray
/// continuation byte).
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(word: &str, merges: &[(&str, &str)]) -> Vec<String> {
        let mut ranks = Ranks::default();
        for (i, (a, b)) in merges.iter().enumerate() {
            ranks.insert(a.as_bytes(), b.as_bytes(), i as u32);
        }
        let mut out = Vec::new();
        merge_word(word.as_bytes(), &ranks, false, &mut out);
        out.iter().map(|&(s, e)| word[s..e].to_string()).collect()
    }

    #[test]
    fn merges_by_rank() {
        assert_eq!(
            run(
                "hello",
                &[("l", "l"), ("h", "e"), ("he", "ll"), ("hell", "o")]
            ),
            ["hello"]
        );
        assert_eq!(
            run("hello", &[("h", "e"), ("e", "l")]),
            ["he", "l", "l", "o"]
        );
        // equal ranks cannot happen; leftmost wins among different pairs of the same text
        assert_eq!(run("aaa", &[("a", "a")]), ["aa", "a"]);
        assert_eq!(run("", &[("a", "a")]), Vec::<String>::new());
    }
}
