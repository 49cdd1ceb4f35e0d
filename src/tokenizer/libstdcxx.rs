//! The iteration order of llama.cpp's `std::unordered_map<std::string, llama_token>
//! token_to_id` as GNU libstdc++ (64-bit) builds it.
//!
//! llama.cpp (`llama_vocab::impl::load`, build 11434) fills `token_to_id[word] = i` for every
//! token in id order, then takes the eot, eom and fim tokens as the *first* token in the map's
//! iteration order whose text is on a list (`<|im_end|>`, `<|endoftext|>`, ...). When a
//! vocabulary has several (Qwen2.5: `<|endoftext|>` 151643 and `<|im_end|>` 151645), the
//! choice is made by the hash table's layout, not by id: llama.cpp picks 151645 for Qwen2.5
//! but 0 (`<|endoftext|>`) over 2 (`<|im_end|>`) for SmolLM2. This module reproduces the
//! layout of libstdc++ (the C++ library of llama.cpp's Linux builds; MSVC's and libc++'s differ):
//!
//! * `std::hash<std::string>` is `std::_Hash_bytes(data, len, 0xc70f6907)` (libsupc++
//!   `hash_bytes.cc`, the 64-bit `size_t` variant);
//! * bucket = hash % bucket_count; the bucket counts after each growth are [`REHASH`]
//!   (`_Prime_rehash_policy`, max load factor 1), measured by `tests/ref/libstdcxx_rehash.cpp`;
//! * a new node goes to the front of its bucket, or to the front of the whole list when its
//!   bucket is empty (`_M_insert_bucket_begin`); a rehash walks the list in order and relinks
//!   the same way (`_M_rehash_aux`, unique keys).

/// `(size, bucket_count)`: inserting the element that makes the map `size` long first rehashes
/// it to `bucket_count` buckets. From `tests/ref/libstdcxx_rehash.cpp` (GCC 12 libstdc++,
/// x86-64); an empty map has 1 bucket.
#[rustfmt::skip]
const REHASH: [(usize, usize); 19] = [
    (1, 13), (14, 29), (30, 59), (60, 127), (128, 257), (258, 541), (542, 1109), (1110, 2357),
    (2358, 5087), (5088, 10273), (10274, 20753), (20754, 42043), (42044, 85229),
    (85230, 172933), (172934, 351061), (351062, 712697), (712698, 1447153),
    (1447154, 2938679), (2938680, 5967347),
];

/// `MAX_KEYS`: the most distinct keys whose order [`iteration_order`] knows: the map grows past
/// [`REHASH`]'s last bucket count beyond this.
pub(super) const MAX_KEYS: usize = 5_967_347;

const SEED: u64 = 0xc70f_6907;
const MUL: u64 = (0xc6a4_a793_u64 << 32) + 0x5bd1_e995;

fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

/// `std::_Hash_bytes(b, b.len(), 0xc70f6907)`: libstdc++'s `std::hash<std::string>` on 64-bit.
pub(super) fn hash_bytes(b: &[u8]) -> u64 {
    let len = b.len();
    let mut hash = SEED ^ (len as u64).wrapping_mul(MUL);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().unwrap());
        let data = shift_mix(v.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        // load_bytes: the remaining bytes, little-endian
        let data = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    shift_mix(shift_mix(hash).wrapping_mul(MUL))
}

/// The order in which iterating `std::unordered_map<std::string, V>` visits the distinct
/// `keys`, after `map[keys[i]] = i` for every `i` in order: indices into `keys` of each
/// key's first occurrence (a repeated key keeps its node). `None` past [`MAX_KEYS`] keys.
pub(super) fn iteration_order<K: AsRef<[u8]>>(keys: &[K]) -> Option<Vec<u32>> {
    let mut t = Table::default();
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    let mut schedule = REHASH.iter().peekable();
    for (i, k) in keys.iter().enumerate() {
        if !seen.insert(k.as_ref()) {
            continue;
        }
        let size = t.hashes.len() + 1;
        if size > MAX_KEYS {
            return None;
        }
        if let Some(&&(at, n_bkt)) = schedule.peek() {
            if at == size {
                schedule.next();
                t.rehash(n_bkt);
            }
        }
        t.insert(hash_bytes(k.as_ref()), i as u32);
    }
    let mut order = Vec::with_capacity(t.hashes.len());
    let mut p = t.head;
    while p != NIL {
        order.push(t.keys[p as usize]);
        p = t.next[p as usize];
    }
    Some(order)
}

const NIL: u32 = u32::MAX;
/// The list head (`_M_before_begin`) as a pseudo-node in `Table::before`.
const BEFORE_BEGIN: u32 = u32::MAX - 1;

/// A libstdc++ `_Hashtable` reduced to its links: node `n` has hash `hashes[n]`, key index
/// `keys[n]` and successor `next[n]`; `before[b]` is the node before bucket `b`'s first node
/// (`BEFORE_BEGIN` for the list head), `NIL` for an empty bucket.
struct Table {
    hashes: Vec<u64>,
    keys: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    before: Vec<u32>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            hashes: Vec::new(),
            keys: Vec::new(),
            next: Vec::new(),
            head: NIL,
            before: vec![NIL],
        }
    }
}

impl Table {
    fn next_of(&self, prev: u32) -> u32 {
        if prev == BEFORE_BEGIN {
            self.head
        } else {
            self.next[prev as usize]
        }
    }
    fn set_next(&mut self, prev: u32, v: u32) {
        if prev == BEFORE_BEGIN {
            self.head = v;
        } else {
            self.next[prev as usize] = v;
        }
    }
    fn bucket(&self, node: u32, n_bkt: usize) -> usize {
        (self.hashes[node as usize] % n_bkt as u64) as usize
    }

    /// `_M_insert_bucket_begin` of a new node.
    fn insert(&mut self, hash: u64, key: u32) {
        let node = self.hashes.len() as u32;
        self.hashes.push(hash);
        self.keys.push(key);
        self.next.push(NIL);
        let n_bkt = self.before.len();
        let b = self.bucket(node, n_bkt);
        let prev = self.before[b];
        if prev != NIL {
            let after = self.next_of(prev);
            self.next[node as usize] = after;
            self.set_next(prev, node);
        } else {
            self.next[node as usize] = self.head;
            self.head = node;
            let after = self.next[node as usize];
            if after != NIL {
                let nb = self.bucket(after, n_bkt);
                self.before[nb] = node;
            }
            self.before[b] = BEFORE_BEGIN;
        }
    }

    /// `_M_rehash_aux(n_bkt, true_type)`: relink the list, in order, into `n_bkt` buckets.
    fn rehash(&mut self, n_bkt: usize) {
        let mut nb = vec![NIL; n_bkt];
        let mut p = self.head;
        self.head = NIL;
        let mut bbegin_bkt = 0usize;
        while p != NIL {
            let nx = self.next[p as usize];
            let b = self.bucket(p, n_bkt);
            if nb[b] == NIL {
                self.next[p as usize] = self.head;
                self.head = p;
                nb[b] = BEFORE_BEGIN;
                if self.next[p as usize] != NIL {
                    nb[bbegin_bkt] = p;
                }
                bbegin_bkt = b;
            } else {
                let prev = nb[b];
                let after = self.next_of(prev);
                self.next[p as usize] = after;
                self.set_next(prev, p);
            }
            p = nx;
        }
        self.before = nb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_libstdcxx() {
        // std::hash<std::string>{}(...) printed by tests/ref/libstdcxx_rehash.cpp
        assert_eq!(hash_bytes(b"abc"), 3_663_726_644_998_027_833);
        assert_eq!(
            hash_bytes(b"<|im_end|> hello world"),
            4_483_143_685_629_586_185
        );
    }

    fn first_12(n: usize) -> Vec<u32> {
        let keys: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        iteration_order(&keys).unwrap()[..12].to_vec()
    }

    #[test]
    fn order_matches_libstdcxx() {
        // "order N:" lines of tests/ref/libstdcxx_rehash.cpp
        assert_eq!(
            first_12(1000),
            [997, 994, 991, 988, 987, 981, 980, 979, 973, 970, 969, 967]
        );
        assert_eq!(
            first_12(200_000),
            [
                199_999, 199_997, 199_995, 199_993, 199_992, 199_988, 199_986, 199_985, 199_983,
                199_982, 199_980, 199_979
            ]
        );
        // a repeated key keeps its first node
        let order = iteration_order(&["a", "b", "a"]).unwrap();
        assert_eq!(order.len(), 2);
        assert!(order.contains(&0) && order.contains(&1));
    }
}
