//! The `attention!` macro: parses and traces the variant at compile time with
//! the same frontend as `aec check`, reports problems at the user's tokens, and
//! emits a unit struct implementing `aec::Variant`.

use proc_macro::TokenStream;
use quote::quote;

/// Declares an attention variant. See the `aec` crate documentation for the DSL.
#[proc_macro]
pub fn attention(input: TokenStream) -> TokenStream {
    let tokens = proc_macro2::TokenStream::from(input);
    let syntax = match aec_frontend::syntax::parse_tokens(tokens.clone()) {
        Ok(s) => s,
        Err(e) => return e.to_compile_error().into(),
    };
    if let Err(d) = aec_frontend::trace::trace(&syntax) {
        return d.to_syn_error().to_compile_error().into();
    }
    let source = tokens.to_string();
    let (attrs, vis, name) = (&syntax.attrs, &syntax.vis, &syntax.name);
    let name_str = name.to_string();
    quote! {
        #(#attrs)*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #vis struct #name;

        impl ::aec::Variant for #name {
            const NAME: &'static str = #name_str;
            const SOURCE: &'static str = #source;

            fn definition() -> &'static ::aec::frontend::Variant {
                static DEFINITION: ::std::sync::OnceLock<::aec::frontend::Variant> = ::std::sync::OnceLock::new();
                DEFINITION.get_or_init(|| {
                    ::aec::frontend::parse_str(Self::SOURCE)
                        .expect("the attention! macro validated this variant when it was compiled")
                })
            }
        }
    }
    .into()
}
