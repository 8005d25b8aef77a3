//! What to say about a TOML syntax error. Every config format of stead
//! (the catalog, the control settings, the daemon's `stead.toml`) reports
//! syntax errors through here, so they read alike.

/// The 1-based line and column (in characters) of byte `offset` of
/// `contents`; an offset past the end or inside a character counts as the
/// end or that character's start.
pub fn position(contents: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(contents.len());
    while !contents.is_char_boundary(end) {
        end -= 1;
    }
    let before = &contents[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// toml's own message, which names the key or the expected token. toml
/// leaves a few errors without one (a carriage return without its line
/// feed, for one); then the character it stopped at and where, so an
/// error never ends in a blank.
pub fn message(error: &toml::de::Error, contents: &str) -> String {
    let message = error.message().trim();
    if !message.is_empty() {
        return message.to_owned();
    }
    let Some(span) = error.span() else {
        return "not valid TOML".to_owned();
    };
    let (line, column) = position(contents, span.start);
    match contents
        .get(span.start..)
        .and_then(|rest| rest.chars().next())
    {
        Some(c) => format!("unexpected character {c:?} at line {line}, column {column}"),
        None => format!("unexpected end of the file at line {line}, column {column}"),
    }
}
