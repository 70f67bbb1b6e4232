//! The DSL's surface syntax, parsed from a token stream with `syn`.
//!
//! This is the one parser behind both the `attention!` macro and `aec check`:
//! it only structures the input (items, closures, the online block); names,
//! types and axes are resolved by the tracer.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprClosure, Ident, LitInt, Token, Visibility, braced, bracketed};

/// `pub struct Name: parallel { … }` — one variant.
#[derive(Debug)]
pub struct VariantSyntax {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub name: Ident,
    pub pattern: Ident,
    pub items: Vec<ItemSyntax>,
}

#[derive(Debug)]
pub enum ItemSyntax {
    /// `q: [B, H, Sq, Dqk]` — an input tensor and its axes.
    Tensor { name: Ident, axes: Vec<AxisSyntax> },
    /// `modify_q = |q| …` — a closure item.
    Closure {
        key: Ident,
        closure: Box<ExprClosure>,
    },
    /// `online { state { … } fwd = |s, st| … epilogue = |o, st| … }`
    Online(OnlineSyntax),
}

/// `Dqk` or `Dqk = 192`.
#[derive(Debug)]
pub struct AxisSyntax {
    pub name: Ident,
    pub size: Option<LitInt>,
}

#[derive(Debug)]
pub struct OnlineSyntax {
    pub keyword: Ident,
    pub state: Vec<(Ident, Expr)>,
    pub fwd: Option<Box<ExprClosure>>,
    pub epilogue: Option<Box<ExprClosure>>,
}

impl VariantSyntax {
    pub fn doc(&self) -> String {
        let mut lines = Vec::new();
        for a in &self.attrs {
            if let syn::Meta::NameValue(nv) = &a.meta
                && nv.path.is_ident("doc")
                && let Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
            {
                lines.push(s.value().trim().to_string());
            }
        }
        lines.join("\n")
    }
}

pub fn parse_tokens(tokens: TokenStream) -> syn::Result<VariantSyntax> {
    syn::parse2(tokens)
}

impl Parse for VariantSyntax {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        for a in &attrs {
            if !a.path().is_ident("doc") {
                return Err(syn::Error::new(
                    a.span(),
                    "only doc comments (`/// …`) may precede a variant",
                ));
            }
        }
        let vis: Visibility = input.parse()?;
        if !input.peek(Token![struct]) {
            return Err(input.error(
                "expected `struct Name: parallel { … }` or `struct Name: recurrent { … }`",
            ));
        }
        input.parse::<Token![struct]>()?;
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `:` and the pattern after the variant name, e.g. `struct Softmax: parallel { … }`",
            )
        })?;
        let pattern: Ident = input.parse()?;
        let body;
        braced!(body in input);
        let mut items = Vec::new();
        while !body.is_empty() {
            items.push(body.parse()?);
            eat_separator(&body)?;
        }
        if !input.is_empty() {
            return Err(input
                .error("unexpected tokens after the variant; one `attention!` holds one variant"));
        }
        Ok(VariantSyntax {
            attrs,
            vis,
            name,
            pattern,
            items,
        })
    }
}

/// Items may be separated by `;` or `,`; after a closing brace none is needed.
fn eat_separator(input: ParseStream) -> syn::Result<()> {
    if input.peek(Token![;]) {
        input.parse::<Token![;]>()?;
    } else if input.peek(Token![,]) {
        input.parse::<Token![,]>()?;
    }
    Ok(())
}

impl Parse for ItemSyntax {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected an item: a tensor (`q: [B, H, Sq, Dqk]`), a closure (`modify_q = |q| …`) or `online { … }`",
            )
        })?;
        if key == "online" && input.peek(syn::token::Brace) {
            return parse_online(key, input).map(ItemSyntax::Online);
        }
        if input.peek(Token![:]) {
            input.parse::<Token![:]>()?;
            let content;
            bracketed!(content in input);
            let mut axes = Vec::new();
            while !content.is_empty() {
                let name: Ident = content.parse()?;
                let size = if content.peek(Token![=]) {
                    content.parse::<Token![=]>()?;
                    Some(content.parse::<LitInt>()?)
                } else {
                    None
                };
                axes.push(AxisSyntax { name, size });
                if !content.is_empty() {
                    content.parse::<Token![,]>()?;
                }
            }
            return Ok(ItemSyntax::Tensor { name: key, axes });
        }
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            let closure = parse_closure(input, &key)?;
            return Ok(ItemSyntax::Closure { key, closure });
        }
        Err(syn::Error::new(
            key.span(),
            format!("expected `:` (a tensor) or `=` (a closure) after `{key}`"),
        ))
    }
}

fn parse_closure(input: ParseStream, key: &Ident) -> syn::Result<Box<ExprClosure>> {
    let expr: Expr = input.parse()?;
    match expr {
        Expr::Closure(c) => Ok(Box::new(c)),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{key}` must be a closure, e.g. `{key} = |x| x`"),
        )),
    }
}

fn parse_online(keyword: Ident, input: ParseStream) -> syn::Result<OnlineSyntax> {
    let content;
    braced!(content in input);
    let mut online = OnlineSyntax {
        keyword,
        state: Vec::new(),
        fwd: None,
        epilogue: None,
    };
    while !content.is_empty() {
        let key: Ident = content.parse()?;
        match key.to_string().as_str() {
            "state" => {
                let fields;
                braced!(fields in content);
                while !fields.is_empty() {
                    let name: Ident = fields.parse()?;
                    fields.parse::<Token![=]>().map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            "expected `=` and an initial value, e.g. `m = -inf`",
                        )
                    })?;
                    let init: Expr = fields.parse()?;
                    online.state.push((name, init));
                    if !fields.is_empty() {
                        fields.parse::<Token![,]>()?;
                    }
                }
            }
            "fwd" | "epilogue" => {
                if content.peek(Token![=]) {
                    content.parse::<Token![=]>()?;
                }
                let c = parse_closure(&content, &key)?;
                let slot = if key == "fwd" {
                    &mut online.fwd
                } else {
                    &mut online.epilogue
                };
                if slot.is_some() {
                    return Err(syn::Error::new(
                        key.span(),
                        format!("`{key}` is given twice"),
                    ));
                }
                *slot = Some(c);
            }
            other => {
                return Err(syn::Error::new(
                    key.span(),
                    format!(
                        "unknown item `{other}` in the online block; expected `state`, `fwd` or `epilogue`"
                    ),
                ));
            }
        }
        eat_separator(&content)?;
    }
    Ok(online)
}

/// The span of a whole closure, for errors about it as a unit.
pub fn closure_span(c: &ExprClosure) -> Span {
    c.or1_token.span
}
