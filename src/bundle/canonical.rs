//! Canonical JSON: the bytes the manifest digests of format versions 2 and 3 are the SHA256 of.
//!
//! The scheme is RFC 8785 (JSON Canonicalization Scheme, JCS) with one change, so that integers
//! beyond 2^53 keep their value: RFC 8785 writes every number as an IEEE 754 double.
//!
//! - **Whitespace**: none between tokens.
//! - **Objects**: members sorted by their keys compared as sequences of UTF-16 code units
//!   (RFC 8785 section 3.2.3; for ASCII keys, byte order). Every member is kept. RFC 8785
//!   takes I-JSON (RFC 7493), where a member name may not appear twice in one object; JSON
//!   parsing (`serde_json::Value`) would keep the last of two, another parser the first, so
//!   two readers could see different content under one digest: the manifest reader refuses
//!   such a document first ([`check_unique_members`]).
//! - **Arrays**: elements in their order.
//! - **Strings**: `"`, then each character: `\"` and `\\` for `"` and `\`; `\b`, `\t`, `\n`,
//!   `\f`, `\r` for U+0008, U+0009, U+000A, U+000C, U+000D; `\u00xx` (lowercase hex) for the
//!   other characters below U+0020; every other character as its UTF-8 bytes, unescaped
//!   (U+007F and non-ASCII included); then `"` (RFC 8785 section 3.2.2.2).
//! - **Literals**: `true`, `false`, `null`.
//! - **Integers** (a number written without fraction or exponent that fits a u64 or an i64):
//!   plain decimal, `-` for negative ones, no leading zeros, `0` for zero. *This is the
//!   departure from RFC 8785*: there 9007199254740993 would become 9007199254740992. For
//!   integers of magnitude at most 2^53 both give the same text.
//! - **Other numbers**: parsed to the nearest IEEE 754 double, then written as ECMAScript's
//!   `Number.prototype.toString` writes it (RFC 8785 section 3.2.2.3): the shortest digit
//!   string `d1 d2 ... dk` that reads back to the same double (the closest to the exact value
//!   where several are shortest), with `n` the decimal exponent such that the value is
//!   `0.d1...dk * 10^n`:
//!   `k <= n <= 21`: the digits and `n - k` zeros (`1e20` is `100000000000000000000`);
//!   `0 < n <= 21`: the first `n` digits, `.`, the rest (`1.5`);
//!   `-6 < n <= 0`: `0.`, `-n` zeros, the digits (`0.000001`);
//!   otherwise `d1`, then `.` and `d2...dk` when `k > 1`, then `e`, `+` or `-`, and
//!   `|n - 1|` (`1e+21`, `1e-7`, `1.5e-7`). A negative value gets `-` first; `-0` is `0`.
//!   An integral double such as `10000.0` is `10000`, so `1.0` and `1` have one canonical
//!   form.
//!
//! JSON parsed by `serde_json` (with `float_roundtrip`) and the same value serialized by it
//! give the same canonical text, so the writer can digest the manifest it is about to write
//! and the reader the manifest it read.

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

/// Checks that no object in the JSON document `bytes` has a member name twice (I-JSON, RFC
/// 7493 section 2.3). On failure, the name and serde_json's line and column.
pub fn check_unique_members(bytes: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<UniqueMembers>(bytes)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A JSON value walked only to find a repeated member name.
struct UniqueMembers;

impl<'de> Deserialize<'de> for UniqueMembers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueMembersVisitor)
    }
}

struct UniqueMembersVisitor;

impl<'de> Visitor<'de> for UniqueMembersVisitor {
    type Value = UniqueMembers;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_unit<E>(self) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueMembers, A::Error> {
        while seq.next_element::<UniqueMembers>()?.is_some() {}
        Ok(UniqueMembers)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueMembers, A::Error> {
        let mut seen = std::collections::BTreeSet::new();
        while let Some(name) = map.next_key::<String>()? {
            map.next_value::<UniqueMembers>()?;
            if let Some(name) = seen.replace(name) {
                return Err(A::Error::custom(format!(
                    "member {name:?} appears twice in one object"
                )));
            }
        }
        Ok(UniqueMembers)
    }
}

/// Appends the canonical form of `v` to `out`.
pub fn write(v: &Json, out: &mut Vec<u8>) {
    match v {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                // serde_json holds no NaN or infinity (JSON cannot spell them).
                let f = n.as_f64().unwrap_or(0.0);
                out.extend_from_slice(ecmascript_number(f).as_bytes());
            }
        }
        Json::String(s) => write_string(s, out),
        Json::Array(a) => {
            out.push(b'[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(e, out);
            }
            out.push(b']');
        }
        Json::Object(o) => {
            let mut members: Vec<(&String, &Json)> = o.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, e)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write(e, out);
            }
            out.push(b'}');
        }
    }
}

/// The canonical form of `v`.
pub fn to_vec(v: &Json) -> Vec<u8> {
    let mut out = Vec::new();
    write(v, &mut out);
    out
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// A finite double as ECMAScript's `Number.prototype.toString` writes it (see the module doc).
/// The shortest round-trip digits come from Ryu (the `ryu` crate), which breaks an exact tie
/// between two shortest candidates toward the even one, as ECMAScript does (Rust's `{:e}`
/// rounds such a tie up: `1424953923781206.3` where RFC 8785 wants `1424953923781206.2`).
pub fn ecmascript_number(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return "0".into();
    }
    let mut buf = ryu::Buffer::new();
    let (digits, n) = decimal_digits(buf.format_finite(f.abs()));
    let k = digits.len() as i64;
    let mut s = String::new();
    if f < 0.0 {
        s.push('-');
    }
    if k <= n && n <= 21 {
        s.push_str(&digits);
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        s.push_str(&digits[..n as usize]);
        s.push('.');
        s.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', (-n) as usize));
        s.push_str(&digits);
    } else {
        s.push_str(&digits[..1]);
        if k > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        s.push('e');
        s.push(if n > 0 { '+' } else { '-' });
        s.push_str(&(n - 1).abs().to_string());
    }
    s
}

/// The significant digits `d1...dk` (no leading or trailing zeros) of a positive decimal
/// number written as `[digits][.digits][e[+-]digits]`, and `n` such that it is
/// `0.d1...dk * 10^n`.
fn decimal_digits(text: &str) -> (String, i64) {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = int.chars().chain(frac.chars()).collect();
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all
        .trim_start_matches('0')
        .trim_end_matches('0')
        .to_string();
    (digits, int.len() as i64 - lead as i64 + exp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let v: Json = serde_json::from_str(text).unwrap();
        String::from_utf8(to_vec(&v)).unwrap()
    }

    /// The number examples of RFC 8785 appendix B (IEEE 754 bit patterns and their text),
    /// and the ECMAScript rules at each boundary.
    #[test]
    fn numbers_as_rfc8785_appendix_b() {
        for (bits, want) in [
            (0x0000000000000000u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            assert_eq!(
                ecmascript_number(f64::from_bits(bits)),
                want,
                "{bits:#018x}"
            );
        }
        for (f, want) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1e-6, "0.000001"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (10000.0, "10000"),
            (1e-5, "0.00001"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(ecmascript_number(f), want, "{f}");
        }
    }

    #[test]
    fn decimal_digits_of_every_form() {
        assert_eq!(decimal_digits("1234.0"), ("1234".into(), 4));
        assert_eq!(decimal_digits("0.00123"), ("123".into(), -2));
        assert_eq!(decimal_digits("1.5e-7"), ("15".into(), -6));
        assert_eq!(decimal_digits("1e21"), ("1".into(), 22));
        assert_eq!(decimal_digits("5E-324"), ("5".into(), -323));
    }

    /// Integers keep their value beyond 2^53 (the one departure from RFC 8785); doubles that
    /// are integral canonicalize as integers do.
    #[test]
    fn integers_exact_and_doubles_integral() {
        assert_eq!(canon("9007199254740993"), "9007199254740993");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
        assert_eq!(canon("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(canon("10000.0"), "10000");
        assert_eq!(canon("1e-5"), "0.00001");
        assert_eq!(canon("-0.0"), "0");
    }

    /// Member order by UTF-16 code units, no whitespace, strings escaped as RFC 8785 says
    /// (the appendix's structure example).
    #[test]
    fn objects_and_strings_as_rfc8785() {
        let got = canon(
            r#"{
              "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
              "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
              "literals": [null, true, false]
            }"#,
        );
        assert_eq!(
            got,
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
        // U+FB33 (one UTF-16 unit, 0xFB33) sorts after U+1F600 (surrogates 0xD83D 0xDE00) in
        // UTF-16 order, before it in code point order.
        assert_eq!(
            canon("{\"\u{fb33}\":1,\"\u{1f600}\":2,\"a\":3}"),
            "{\"a\":3,\"\u{1f600}\":2,\"\u{fb33}\":1}"
        );
        assert_eq!(
            canon("\"\\u007f\\b\\f\\r\\t\\u0001\""),
            "\"\u{7f}\\b\\f\\r\\t\\u0001\""
        );
    }

    /// What serde_json writes and reads back canonicalizes as the value it wrote.
    #[test]
    fn serde_round_trip_is_stable() {
        let v = serde_json::json!({
            "eps": 1e-5, "base": 10000.0, "big": u64::MAX, "neg": -3i64,
            "f": [0.1, 1.0 / 3.0, f64::MIN_POSITIVE, 6.02e23], "s": "a\u{1}b\u{2028}",
        });
        let text = serde_json::to_string_pretty(&v).unwrap();
        let back: Json = serde_json::from_str(&text).unwrap();
        assert_eq!(to_vec(&v), to_vec(&back));
    }
}
