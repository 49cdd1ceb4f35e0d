//! Chat templates: the GGUF's Jinja `chat_template` rendered with minijinja, configured as
//! llama.cpp's jinja engine (common/jinja: `trim_blocks` and `lstrip_blocks` on, a single
//! trailing newline of the template dropped, `raise_exception` and `strftime_now`).

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, ErrorKind, Value};

use super::TokenizerError;

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(&format, secs).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// A small `strftime` over UTC time, for the formats chat templates use (`%d %b %Y`,
/// `%Y-%m-%d`, ...).
pub(crate) fn strftime_utc(format: &str, unix_secs: i64) -> Result<String, String> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = unix_secs.div_euclid(86400);
    let secs = unix_secs.rem_euclid(86400);
    let (h, mi, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    // civil_from_days (H. Hinnant)
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 4).rem_euclid(7) as usize;
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{h:02}:{mi:02}:{s:02}")),
            Some('%') => out.push('%'),
            Some(other) => return Err(format!("strftime_now: unsupported format %{other}")),
            None => return Err("strftime_now: format ends in %".to_string()),
        }
    }
    Ok(out)
}

/// The instruction budget of one chat-template render (minijinja fuel).
const TEMPLATE_FUEL: u64 = 2_000_000;

/// Renders `template` for `messages` (`(role, content)`).
pub(crate) fn render(
    template: &str,
    messages: &[(&str, &str)],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TokenizerError> {
    let mut env = Environment::new();
    // A template is data from the model file: bound its work (about 2e6 instructions; a
    // real chat template spends some hundreds per message) so that nested loops end in an
    // error, not in gigabytes of output.
    env.set_fuel(Some(TEMPLATE_FUEL));
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    let tmpl = env
        .template_from_named_str("chat_template", template)
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
    let msgs: Value = messages
        .iter()
        .map(|&(role, content)| Value::from_pairs([("role", role), ("content", content)]))
        .collect();
    tmpl.render(context! {
        messages => msgs,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        enable_thinking => true,
    })
    .map_err(|e| TokenizerError::Template(describe(&e)))
}

/// The error with its chain of causes on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime() {
        // 2024-02-29 13:05:09 UTC, a Thursday
        let t = 1709211909;
        assert_eq!(strftime_utc("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %A %j", t).unwrap(),
            "2024-02-29 13:05:09 Thursday 060"
        );
        assert_eq!(
            strftime_utc("%F %T %%", 0).unwrap(),
            "1970-01-01 00:00:00 %"
        );
        assert!(strftime_utc("%Q", 0).is_err());
    }

    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let t = "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}";
        let e = render(t, &[("user", "hi")], true, "", "").unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        // A realistic template over many messages stays well inside the budget.
        let chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let msgs: Vec<(&str, &str)> = (0..2000).map(|_| ("user", "hello")).collect();
        assert!(render(chatml, &msgs, true, "", "").is_ok());
    }

    #[test]
    fn raise_exception_is_an_error() {
        let e = render("{{ raise_exception('nope') }}", &[], false, "", "").unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn python_methods_and_blocks() {
        // checked with Python jinja2 (trim_blocks, lstrip_blocks): 'hi|yo|'
        let t = "{% for m in messages %}\n  {% if true %}{{ m.content.strip() }}|{% endif %}\n{% endfor %}\n";
        let out = render(
            t,
            &[("user", "  hi  "), ("assistant", "yo\n")],
            false,
            "<s>",
            "</s>",
        )
        .unwrap();
        assert_eq!(out, "hi|yo|");
    }
}
