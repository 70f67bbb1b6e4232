{# The recurrent templates' element type, kernel parameters and point
   (included first by each; needs sp and params_fields). #}typedef {{ sp.c_type }} elem_t;

// The custom inputs (and, in the backward, their gradients) and the sizes.
struct Params {
{{ params_fields }}    int B, H, S;
};

// A point of the iteration space: batch, head, step, head-dim coordinate.
struct Pt {
    int b, h, t, d;
};
