//! How a knob's value is read from and written as text: one parser per type, so that every
//! boolean, number, size and path is read the same way whatever knob it belongs to.

use std::path::PathBuf;
use std::time::Duration;

/// The range a numeric knob accepts, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub lo: u64,
    pub hi: u64,
}

/// A value a knob can hold: parsed from the text of an environment variable, shown as that
/// text again (the form the ranks compare and the docs print).
pub(crate) trait Value: Sized {
    /// The type's name in docs/CONFIG.md.
    const TYPE: &'static str;
    /// Parses `text` (already trimmed, never empty); the error says what is allowed.
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String>;
    /// The value as the text that parses back to it.
    fn show(&self) -> String;
}

fn number(text: &str, range: Option<Range>, unit: &str) -> Result<u64, String> {
    let n: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number{unit}"))?;
    match range {
        Some(r) if !(r.lo..=r.hi).contains(&n) => Err(format!(
            "{n} is out of range: use {} to {}{unit}",
            r.lo, r.hi
        )),
        _ => Ok(n),
    }
}

/// Booleans: `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no` (any case), nothing else.
impl Value for bool {
    const TYPE: &'static str = "bool";
    fn parse(text: &str, _: Option<Range>) -> Result<Self, String> {
        match text.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(format!("{text:?} is not a boolean: use 1 or 0")),
        }
    }
    fn show(&self) -> String {
        u8::from(*self).to_string()
    }
}

impl Value for u32 {
    const TYPE: &'static str = "integer";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        let n = number(text, range, "")?;
        u32::try_from(n).map_err(|_| format!("{n} does not fit 32 bits"))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl Value for u64 {
    const TYPE: &'static str = "integer";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        number(text, range, "")
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

/// Durations are whole milliseconds.
impl Value for Duration {
    const TYPE: &'static str = "milliseconds";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        number(text, range, " ms").map(Duration::from_millis)
    }
    fn show(&self) -> String {
        self.as_millis().to_string()
    }
}

/// A size in bytes, or `off` (never): `None` is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesOrOff(pub Option<u64>);

impl Value for BytesOrOff {
    const TYPE: &'static str = "bytes or `off`";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        number(text, range, " bytes (or off)").map(|n| Self(Some(n)))
    }
    fn show(&self) -> String {
        self.0.map_or_else(|| "off".to_owned(), |n| n.to_string())
    }
}

/// A choice the code makes unless forced: `auto`, or a boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Auto {
    /// The code decides.
    #[default]
    Auto,
    /// Forced on (`1`) or off (`0`).
    Forced(bool),
}

impl Value for Auto {
    const TYPE: &'static str = "`auto` or bool";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        bool::parse(text, range)
            .map(Self::Forced)
            .map_err(|_| format!("{text:?} is not auto, 1 or 0"))
    }
    fn show(&self) -> String {
        match self {
            Self::Auto => "auto".to_owned(),
            Self::Forced(b) => b.show(),
        }
    }
}

/// Which engine moves each half of a copy-engine message in a launch that sends to and
/// receives from the same peer: `SEND-RECV`, each `sm` or `ce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CeBoth {
    /// The pushed chunks of the send role are moved by SMs (else by the copy engine).
    pub send_by_sm: bool,
    /// The pulled chunks of the receive role are moved by SMs (else by the copy engine).
    pub recv_by_sm: bool,
}

impl Default for CeBoth {
    fn default() -> Self {
        Self {
            send_by_sm: true,
            recv_by_sm: false,
        }
    }
}

impl Value for CeBoth {
    const TYPE: &'static str = "`sm-ce`, `ce-ce`, `sm-sm` or `ce-sm`";
    fn parse(text: &str, _: Option<Range>) -> Result<Self, String> {
        let engine = |s: &str| match s {
            "sm" => Ok(true),
            "ce" => Ok(false),
            _ => Err(format!("{text:?} is not SEND-RECV with each `sm` or `ce`")),
        };
        let (send, recv) = text
            .to_ascii_lowercase()
            .split_once('-')
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .ok_or_else(|| format!("{text:?} is not SEND-RECV with each `sm` or `ce`"))?;
        Ok(Self {
            send_by_sm: engine(&send)?,
            recv_by_sm: engine(&recv)?,
        })
    }
    fn show(&self) -> String {
        let e = |sm: bool| if sm { "sm" } else { "ce" };
        format!("{}-{}", e(self.send_by_sm), e(self.recv_by_sm))
    }
}

impl Value for Option<u32> {
    const TYPE: &'static str = "integer";
    fn parse(text: &str, range: Option<Range>) -> Result<Self, String> {
        u32::parse(text, range).map(Some)
    }
    fn show(&self) -> String {
        self.map_or_else(String::new, |n| n.to_string())
    }
}

impl Value for Option<String> {
    const TYPE: &'static str = "text";
    fn parse(text: &str, _: Option<Range>) -> Result<Self, String> {
        Ok(Some(text.to_owned()))
    }
    fn show(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

impl Value for Option<PathBuf> {
    const TYPE: &'static str = "path";
    fn parse(text: &str, _: Option<Range>) -> Result<Self, String> {
        Ok(Some(PathBuf::from(text)))
    }
    fn show(&self) -> String {
        self.as_ref()
            .map_or_else(String::new, |p| p.display().to_string())
    }
}

/// Options split at whitespace (NVRTC options of the experiment knobs).
impl Value for Vec<String> {
    const TYPE: &'static str = "options";
    fn parse(text: &str, _: Option<Range>) -> Result<Self, String> {
        Ok(text.split_whitespace().map(str::to_owned).collect())
    }
    fn show(&self) -> String {
        self.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_read_one_way() {
        for t in ["1", "true", "ON", "Yes"] {
            assert_eq!(bool::parse(t, None), Ok(true), "{t}");
        }
        for t in ["0", "false", "Off", "no"] {
            assert_eq!(bool::parse(t, None), Ok(false), "{t}");
        }
        for t in ["2", "", "enable", "01"] {
            assert!(bool::parse(t, None).is_err(), "{t}");
        }
    }

    #[test]
    fn numbers_keep_to_their_range() {
        let r = Some(Range { lo: 1, hi: 64 });
        assert_eq!(u32::parse("64", r), Ok(64));
        assert!(u32::parse("0", r).unwrap_err().contains("use 1 to 64"));
        assert!(u32::parse("65", r).is_err());
        assert!(u32::parse("-1", r).is_err());
        assert!(u32::parse("4k", r)
            .unwrap_err()
            .contains("not a whole number"));
        assert_eq!(
            Duration::parse("1500", None),
            Ok(Duration::from_millis(1500))
        );
    }

    #[test]
    fn every_value_shows_as_text_that_parses_back() {
        fn round<T: Value + PartialEq + std::fmt::Debug>(v: T) {
            assert_eq!(T::parse(&v.show(), None), Ok(v));
        }
        round(true);
        round(false);
        round(7u32);
        round(Duration::from_millis(10_000));
        round(BytesOrOff(None));
        round(BytesOrOff(Some(64 << 20)));
        round(Auto::Auto);
        round(Auto::Forced(false));
        round(CeBoth::default());
        round(CeBoth {
            send_by_sm: false,
            recv_by_sm: true,
        });
        round(vec!["-DA=1".to_owned(), "-DB".to_owned()]);
    }

    #[test]
    fn ce_both_refuses_what_it_does_not_know() {
        assert!(CeBoth::parse("sm", None).is_err());
        assert!(CeBoth::parse("gpu-ce", None).is_err());
        assert!(Auto::parse("maybe", None).is_err());
        assert!(BytesOrOff::parse("never", None).is_err());
    }
}
