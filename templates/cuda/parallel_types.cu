{# The element type, the variant's parameters (custom inputs, then the sizes)
   and a score's coordinates, as every parallel template's closures take
   them (needs `sp` and `params_fields`). #}typedef {{ sp.c_type }} elem_t;

struct Params {
{{ params_fields }}    int B, H, Hkv, Sq, Skv;
};

struct Pt {
    int b, h, hk, i, j, d;
};
