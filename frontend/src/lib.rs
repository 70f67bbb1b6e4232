//! aec frontend: the attention DSL, its tracer into the graph IR, reverse-mode
//! autodiff with the derived online-normalisation backward, and the f64
//! reference interpreter.
//!
//! This crate does no I/O and needs no GPU: it takes token streams or strings
//! and returns data.
//!
//! ```
//! let v = aec_frontend::parse_str(r#"
//!     pub struct Relu: parallel {
//!         q: [B, H, Sq, Dqk], k: [B, H, Skv, Dqk], v: [B, H, Skv, Dv];
//!         modify_scores = |s| relu(s) / Skv;
//!     }
//! "#).unwrap();
//! assert_eq!(v.name, "Relu");
//! ```

pub mod autodiff;
pub mod derive;
pub mod diag;
pub mod ir;
pub mod print;
pub mod reference;
pub mod syntax;
pub mod trace;
pub mod variant;

pub use diag::Diagnostic;
pub use variant::{Pattern, Variant};

use proc_macro2::TokenStream;

/// Parses, traces and validates one variant from the `attention!` body tokens.
pub fn parse_tokens(tokens: TokenStream) -> Result<Variant, Diagnostic> {
    let syntax = syntax::parse_tokens(tokens)?;
    trace::trace(&syntax)
}

/// Like [`parse_tokens`], from source text (the body of an `attention!`).
pub fn parse_str(source: &str) -> Result<Variant, Diagnostic> {
    let tokens: TokenStream = source.parse().map_err(|e: proc_macro2::LexError| {
        Diagnostic::new(e.span(), format!("cannot tokenize: {e}"))
    })?;
    parse_tokens(tokens)
}

/// One `attention! { … }` invocation found in a Rust file.
#[derive(Debug)]
pub struct Invocation {
    /// 1-based line of the `attention!` path.
    pub line: usize,
    pub variant: Result<Variant, Diagnostic>,
}

/// Finds every `attention! { … }` in a Rust source file (at item level, in
/// inline modules and in function bodies) and parses each. The outer error
/// is a file that is not Rust.
pub fn parse_file(source: &str) -> Result<Vec<Invocation>, Diagnostic> {
    let file = syn::parse_file(source)?;
    let mut found = Vec::new();
    for item in &file.items {
        collect_item(item, &mut found);
    }
    Ok(found
        .into_iter()
        .map(|m| Invocation {
            line: m
                .path
                .segments
                .last()
                .map(|s| s.ident.span().start().line)
                .unwrap_or(0),
            variant: parse_macro_body(m),
        })
        .collect())
}

/// Parses a macro's body inside its delimiters, so that "unexpected end of
/// input" points at the closing delimiter rather than the start of the file.
fn parse_macro_body(m: &syn::Macro) -> Result<Variant, Diagnostic> {
    use proc_macro2::{Delimiter, Group, TokenTree};
    use syn::parse::{ParseStream, Parser};
    let (delimiter, span) = match &m.delimiter {
        syn::MacroDelimiter::Paren(p) => (Delimiter::Parenthesis, p.span.join()),
        syn::MacroDelimiter::Brace(b) => (Delimiter::Brace, b.span.join()),
        syn::MacroDelimiter::Bracket(b) => (Delimiter::Bracket, b.span.join()),
    };
    let mut group = Group::new(delimiter, m.tokens.clone());
    group.set_span(span);
    let body = |input: ParseStream| -> syn::Result<syntax::VariantSyntax> {
        let content;
        match delimiter {
            Delimiter::Parenthesis => {
                syn::parenthesized!(content in input);
            }
            Delimiter::Bracket => {
                syn::bracketed!(content in input);
            }
            _ => {
                syn::braced!(content in input);
            }
        }
        content.parse()
    };
    let syntax = body.parse2(TokenTree::Group(group).into())?;
    trace::trace(&syntax)
}

fn is_attention(m: &syn::Macro) -> bool {
    m.path
        .segments
        .last()
        .is_some_and(|s| s.ident == "attention")
}

fn collect_item<'a>(item: &'a syn::Item, out: &mut Vec<&'a syn::Macro>) {
    match item {
        syn::Item::Macro(m) if is_attention(&m.mac) => out.push(&m.mac),
        syn::Item::Mod(m) => {
            for i in m.content.iter().flat_map(|(_, items)| items) {
                collect_item(i, out);
            }
        }
        syn::Item::Fn(f) => collect_block(&f.block, out),
        _ => {}
    }
}

fn collect_block<'a>(block: &'a syn::Block, out: &mut Vec<&'a syn::Macro>) {
    for stmt in &block.stmts {
        match stmt {
            syn::Stmt::Item(i) => collect_item(i, out),
            syn::Stmt::Macro(m) if is_attention(&m.mac) => out.push(&m.mac),
            _ => {}
        }
    }
}
