//! `convert inspect`: a GGUF file's header, metadata and tensor table, as stable JSON or text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value as Json};

use crate::gguf::GgufFile;

/// Per-type totals.
#[derive(Default, Clone, Copy)]
struct Totals {
    tensors: u64,
    elements: u64,
    bytes: u64,
}

/// The inspection report as JSON. Keys appear in a fixed order; metadata in file order with
/// arrays longer than [`crate::gguf::SUMMARY_ARRAY_LEN`] summarized; tensors in file order;
/// totals sorted by type name.
pub fn report_json(f: &GgufFile) -> Json {
    let metadata: serde_json::Map<String, Json> = f
        .metadata
        .iter()
        .map(|(k, v)| {
            let mut entry = serde_json::Map::new();
            entry.insert("type".into(), json!(v.value_type().name()));
            if let crate::gguf::Value::Array(et, items) = v {
                entry.insert("elem_type".into(), json!(et.name()));
                entry.insert("len".into(), json!(items.len()));
            }
            entry.insert("value".into(), v.to_json_summary());
            (k.clone(), Json::Object(entry))
        })
        .collect();
    let tensors: Vec<Json> = f
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "type_id": t.ty.id(),
                "ne": t.ne,
                "shape": t.shape(),
                "n_elements": t.n_elements(),
                "n_bytes": t.n_bytes,
                "offset": t.offset,
                "abs_offset": t.abs_offset,
            })
        })
        .collect();
    let (by_type, all) = totals(f);
    let by_type: serde_json::Map<String, Json> = by_type
        .into_iter()
        .map(|(k, t)| {
            (
                k.to_string(),
                json!({"tensors": t.tensors, "elements": t.elements, "bytes": t.bytes}),
            )
        })
        .collect();
    json!({
        "file": f.path().display().to_string(),
        "file_size": f.file_len(),
        "gguf_version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "architecture": f.architecture(),
        "metadata_count": f.metadata.len(),
        "tensor_count": f.tensors.len(),
        "metadata": metadata,
        "tensors": tensors,
        "totals_by_type": by_type,
        "totals": {"tensors": all.tensors, "elements": all.elements, "bytes": all.bytes},
    })
}

fn totals(f: &GgufFile) -> (BTreeMap<&'static str, Totals>, Totals) {
    let mut by_type: BTreeMap<&'static str, Totals> = BTreeMap::new();
    let mut all = Totals::default();
    for t in &f.tensors {
        for acc in [by_type.entry(t.ty.name()).or_default(), &mut all] {
            acc.tensors += 1;
            acc.elements += t.n_elements();
            acc.bytes += t.n_bytes;
        }
    }
    (by_type, all)
}

/// The inspection report as aligned text for a terminal.
pub fn report_text(f: &GgufFile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "file:          {}", f.path().display());
    let _ = writeln!(s, "size:          {} bytes", f.file_len());
    let _ = writeln!(s, "gguf version:  {}", f.version);
    let _ = writeln!(s, "alignment:     {}", f.alignment);
    let _ = writeln!(s, "data offset:   {}", f.data_offset);
    let _ = writeln!(s, "\nmetadata ({} keys):", f.metadata.len());
    for (k, v) in &f.metadata {
        let mut val = v.to_json_summary().to_string();
        if val.len() > 160 {
            let mut cut = 157;
            while !val.is_char_boundary(cut) {
                cut -= 1;
            }
            val.truncate(cut);
            val.push_str("...");
        }
        let _ = writeln!(
            s,
            "  {:<48} {:<7} {val}",
            crate::util::printable(k),
            v.value_type().name()
        );
    }
    let _ = writeln!(s, "\ntensors ({}):", f.tensors.len());
    let _ = writeln!(
        s,
        "  {:<40} {:<6} {:<24} {:<24} {:>12} {:>12}",
        "name", "type", "ne", "shape (row-major)", "bytes", "offset"
    );
    for t in &f.tensors {
        let _ = writeln!(
            s,
            "  {:<40} {:<6} {:<24} {:<24} {:>12} {:>12}",
            crate::util::printable(&t.name),
            t.ty.name(),
            format!("{:?}", t.ne),
            format!("{:?}", t.shape()),
            t.n_bytes,
            t.offset
        );
    }
    let (by_type, all) = totals(f);
    let _ = writeln!(s, "\ntotals by type:");
    for (ty, t) in by_type {
        let _ = writeln!(
            s,
            "  {ty:<8} {:>6} tensors {:>14} elements {:>14} bytes",
            t.tensors, t.elements, t.bytes
        );
    }
    let _ = writeln!(
        s,
        "  {:<8} {:>6} tensors {:>14} elements {:>14} bytes",
        "all", all.tensors, all.elements, all.bytes
    );
    s
}
