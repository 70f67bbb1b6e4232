//! Diagnostics that point at the user's tokens.
//!
//! A [`Diagnostic`] carries a `proc_macro2::Span`: inside the `attention!` macro
//! it is the compiler's span (so `compile_error!` lands on the right token); when
//! the CLI parses a file it carries line and column (proc-macro2's
//! `span-locations`), which [`Diagnostic::render`] turns into `file:line:col`.

use proc_macro2::Span;
use std::fmt::{self, Write};

#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub span: Span,
    pub message: String,
    pub help: Option<String>,
}

pub type Result<T> = std::result::Result<T, Diagnostic>;

impl Diagnostic {
    pub fn new(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            span,
            message: message.into(),
            help: None,
        }
    }

    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    /// The error as the macro reports it (help folded into the message).
    pub fn to_syn_error(&self) -> syn::Error {
        let mut msg = self.message.clone();
        if let Some(h) = &self.help {
            msg.push_str("\n  = help: ");
            msg.push_str(h);
        }
        syn::Error::new(self.span, msg)
    }

    /// 1-based line and column of the span's start.
    pub fn line_col(&self) -> (usize, usize) {
        let start = self.span.start();
        (start.line, start.column + 1)
    }

    /// rustc-style rendering against the source text the spans refer to.
    pub fn render(&self, file: &str, source: &str) -> String {
        let start = self.span.start();
        let end = self.span.end();
        let mut out = String::new();
        let gutter = start.line.to_string();
        let pad = " ".repeat(gutter.len());
        let _ = writeln!(out, "error: {}", self.message);
        let _ = writeln!(out, "{pad}--> {file}:{}:{}", start.line, start.column + 1);
        if let Some(text) = source.lines().nth(start.line.saturating_sub(1)) {
            let width = if end.line == start.line && end.column > start.column {
                end.column - start.column
            } else {
                1
            };
            // Columns count chars; keep tabs so the caret lines up.
            let lead: String = text
                .chars()
                .take(start.column)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let _ = writeln!(out, "{pad} |");
            let _ = writeln!(out, "{gutter} | {text}");
            let _ = writeln!(out, "{pad} | {lead}{}", "^".repeat(width));
        }
        if let Some(h) = &self.help {
            let _ = writeln!(out, "  = help: {h}");
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(h) = &self.help {
            write!(f, " (help: {h})")?;
        }
        Ok(())
    }
}

impl From<syn::Error> for Diagnostic {
    fn from(e: syn::Error) -> Diagnostic {
        Diagnostic::new(e.span(), e.to_string())
    }
}

/// The closest candidate to `name`, for "did you mean" hints.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < name.len().max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}
