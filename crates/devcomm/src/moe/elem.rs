//! The row element types of the host models (bf16, f16, f32): [`Elem`].

/// A row element: converted to `f32` to compute, rounded to nearest even back.
pub trait Elem: Copy + PartialEq + std::fmt::Debug + Default {
    /// The value in `f32` (exact for bf16, f16 and f32).
    fn to_f32(self) -> f32;
    /// `x` rounded to nearest even.
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

impl Elem for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}
