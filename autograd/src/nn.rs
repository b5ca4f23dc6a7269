//! Model building blocks whose parameters are tape variables: [`Linear`] and [`Mlp`], with
//! safetensors files for trained weights.
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::nn::{Activation, Mlp};
//! use opsmith_autograd::{Tape, Var, ops};
//! use opsmith_host::{DType, Device, Labels, Tensor};
//! let tape = Tape::new();
//! let mlp = Mlp::new(&tape, &[2, 16, 3], Activation::Relu, DType::F32, Device::Cpu, 7)?;
//! let x = Var::constant(Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], [2, 2], Device::Cpu)?);
//! let logits = mlp.forward(&x)?; // [2, 3]
//! let loss = ops::cross_entropy(&logits, &Labels::new(&[0, 2], Device::Cpu)?)?;
//! let grads = tape.backward(&loss)?;
//! assert_eq!(grads.get(&mlp.parameters()[0]).unwrap().dims(), [2, 16]);
//! # Ok(()) }
//! ```
use crate::tape::{Tape, Var};
use crate::{Error, Result, ops};
use opsmith_host::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The nonlinearity between the layers of an [`Mlp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh form.
    Gelu,
    /// `x·σ(x)`.
    Silu,
}

impl Activation {
    /// Applies the activation as a differentiable op.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Var, nn::Activation};
    /// use opsmith_host::{Device, Tensor};
    /// let x = Var::constant(Tensor::from_vec(vec![-1.0f32, 2.0], [2], Device::Cpu)?);
    /// assert_eq!(Activation::Relu.apply(&x)?.value().to_vec::<f32>()?, [0.0, 2.0]);
    /// # Ok(()) }
    /// ```
    pub fn apply(self, x: &Var) -> Result<Var> {
        match self {
            Activation::Relu => ops::relu(x),
            Activation::Gelu => ops::gelu(x),
            Activation::Silu => ops::silu(x),
        }
    }

    /// The name stored in model files.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::nn::Activation;
    /// assert_eq!(Activation::Gelu.name(), "gelu");
    /// # Ok(()) }
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Silu => "silu",
        }
    }

    /// The activation named `name` (as [`Activation::name`] gives it).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::nn::Activation;
    /// assert_eq!(Activation::from_name("silu"), Some(Activation::Silu));
    /// assert_eq!(Activation::from_name("tanh"), None);
    /// # Ok(()) }
    /// ```
    pub fn from_name(name: &str) -> Option<Activation> {
        [Activation::Relu, Activation::Gelu, Activation::Silu].into_iter().find(|a| a.name() == name)
    }
}

/// A deterministic uniform generator for weight initialisation (SplitMix64), so a seed gives the
/// same model on every platform and device.
struct SplitMix(u64);

impl SplitMix {
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values uniform in `±bound`, or `None` when the host cannot hold them (a layer too
    /// large to initialise is an error, not an abort).
    fn uniform(&mut self, n: usize, bound: f64) -> Option<Vec<f64>> {
        let mut values = Vec::new();
        values.try_reserve_exact(n).ok()?;
        values.extend((0..n).map(|_| (2.0 * self.next_unit() - 1.0) * bound));
        Some(values)
    }
}

/// Makes a parameter: tracked on `tape` when there is one, else a constant (inference).
fn parameter(tape: Option<&Tape>, value: Tensor) -> Var {
    match tape {
        Some(tape) => tape.var(value),
        None => Var::constant(value),
    }
}

/// A fully connected layer, `y = x · W + b`, for `x` of shape `[batch, in]`, `W` of shape
/// `[in, out]` and `b` of shape `[out]`: one GEMM and one bias-row kernel.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Var,
    bias: Var,
}

impl Linear {
    /// A layer initialised like PyTorch's `nn.Linear`: weight and bias uniform in
    /// `±1/√in_features`, from `seed`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, Var, nn::Linear};
    /// use opsmith_host::{DType, Device, Tensor};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// let x = Var::constant(Tensor::from_vec(vec![1.0f32; 12], [4, 3], Device::Cpu)?);
    /// assert_eq!(layer.forward(&x)?.value().dims(), [4, 2]);
    /// # Ok(()) }
    /// ```
    pub fn new(
        tape: &Tape,
        in_features: usize,
        out_features: usize,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(Error::InvalidConfig {
                what: "Linear",
                reason: format!("features must be positive, got {in_features} -> {out_features}"),
            });
        }
        if !dtype.is_float() {
            return Err(Error::InvalidConfig {
                what: "Linear",
                reason: format!("a layer's parameters must be floating-point, got {dtype}"),
            });
        }
        let too_big = || Error::InvalidConfig {
            what: "Linear",
            reason: format!("a [{in_features}, {out_features}] weight is too large to initialise in host memory"),
        };
        let weights = in_features.checked_mul(out_features).ok_or_else(too_big)?;
        let mut rng = SplitMix(seed);
        let bound = 1.0 / (in_features as f64).sqrt();
        let weight = Tensor::from_f64(
            &rng.uniform(weights, bound).ok_or_else(too_big)?,
            [in_features, out_features],
            dtype,
            device,
        )?;
        let bias =
            Tensor::from_f64(&rng.uniform(out_features, bound).ok_or_else(too_big)?, [out_features], dtype, device)?;
        Linear::from_tensors(weight, bias, Some(tape))
    }

    /// A layer from existing tensors (`weight` `[in, out]` with `in, out > 0`, `bias` `[out]`,
    /// same dtype and device), tracked on `tape`, or constants for inference when `tape` is `None`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Var, nn::Linear};
    /// use opsmith_host::{Device, Tensor};
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 2.0], [2, 2], Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![0.5f32, -0.5], [2], Device::Cpu)?;
    /// let layer = Linear::from_tensors(w, b, None)?;
    /// let x = Var::constant(Tensor::from_vec(vec![3.0f32, 4.0], [1, 2], Device::Cpu)?);
    /// assert_eq!(layer.forward(&x)?.value().to_vec::<f32>()?, [3.5, 7.5]);
    /// # Ok(()) }
    /// ```
    pub fn from_tensors(weight: Tensor, bias: Tensor, tape: Option<&Tape>) -> Result<Linear> {
        let [inputs, out] = *weight.dims() else {
            return Err(Error::InvalidConfig {
                what: "Linear",
                reason: format!("the weight must be [in, out], got shape {:?}", weight.dims()),
            });
        };
        if inputs == 0 || out == 0 {
            return Err(Error::InvalidConfig {
                what: "Linear",
                reason: format!("features must be positive, got a weight of shape [{inputs}, {out}]"),
            });
        }
        if bias.dims() != [out] {
            return Err(opsmith_host::Error::ShapeMismatch {
                op: "Linear::from_tensors",
                lhs: vec![out],
                rhs: bias.dims().to_vec(),
            }
            .into());
        }
        if bias.dtype() != weight.dtype() {
            return Err(opsmith_host::Error::DTypeMismatch {
                op: "Linear::from_tensors",
                lhs: weight.dtype(),
                rhs: bias.dtype(),
            }
            .into());
        }
        if !weight.dtype().is_float() {
            return Err(Error::InvalidConfig {
                what: "Linear",
                reason: format!("a layer's parameters must be floating-point, got {}", weight.dtype()),
            });
        }
        if bias.device() != weight.device() {
            return Err(opsmith_host::Error::DeviceMismatch {
                op: "Linear::from_tensors",
                lhs: weight.device(),
                rhs: bias.device(),
            }
            .into());
        }
        Ok(Linear { weight: parameter(tape, weight), bias: parameter(tape, bias) })
    }

    /// `x · W + b` for `x` of shape `[batch, in]`: one [`ops::linear`].
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// let x = opsmith_autograd::Var::constant(opsmith_host::Tensor::from_vec(vec![0.5f32; 6], [2, 3], Device::Cpu)?);
    /// assert_eq!(layer.forward(&x)?.value().dims(), [2, 2]);
    /// # Ok(()) }
    /// ```
    pub fn forward(&self, x: &Var) -> Result<Var> {
        ops::linear(x, &self.weight, &self.bias)
    }

    /// `max(x · W + b, 0)`: the layer and a ReLU as one [`ops::linear_relu`] (one kernel on CUDA
    /// for a small layer, where the two apart are a product, a bias and a ReLU).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// let x = opsmith_autograd::Var::constant(opsmith_host::Tensor::from_vec(vec![0.5f32; 6], [2, 3], Device::Cpu)?);
    /// assert!(layer.forward_relu(&x)?.value().to_vec::<f32>()?.iter().all(|&v| v >= 0.0));
    /// # Ok(()) }
    /// ```
    pub fn forward_relu(&self, x: &Var) -> Result<Var> {
        ops::linear_relu(x, &self.weight, &self.bias)
    }

    /// The weight, `[in, out]`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// assert_eq!(layer.weight().value().dims(), [3, 2]);
    /// # Ok(()) }
    /// ```
    pub fn weight(&self) -> &Var {
        &self.weight
    }

    /// The bias, `[out]`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// assert_eq!(layer.bias().value().dims(), [2]);
    /// # Ok(()) }
    /// ```
    pub fn bias(&self) -> &Var {
        &self.bias
    }

    /// Input features.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// assert_eq!(layer.in_features(), 3);
    /// # Ok(()) }
    /// ```
    pub fn in_features(&self) -> usize {
        self.weight.value().dims()[0]
    }

    /// Output features.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::Linear};
    /// use opsmith_host::{DType, Device};
    /// let layer = Linear::new(&Tape::new(), 3, 2, DType::F32, Device::Cpu, 1)?;
    /// assert_eq!(layer.out_features(), 2);
    /// # Ok(()) }
    /// ```
    pub fn out_features(&self) -> usize {
        self.weight.value().dims()[1]
    }
}

/// A multilayer perceptron: [`Linear`] layers with an [`Activation`] between them (not after
/// the last, whose outputs are logits).
#[derive(Clone, Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
    activation: Activation,
}

/// The metadata key that marks an opsmith MLP file, and its value.
const FORMAT_KEY: (&str, &str) = ("format", "opsmith-mlp-v1");

impl Mlp {
    /// An MLP with layer widths `sizes` (`[in, hidden…, out]`, at least two), layer `i`
    /// initialised from `seed + i`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[4, 32, 32, 2], Activation::Gelu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.sizes(), [4, 32, 32, 2]);
    /// assert_eq!(mlp.parameters().len(), 6);
    /// # Ok(()) }
    /// ```
    pub fn new(
        tape: &Tape,
        sizes: &[usize],
        activation: Activation,
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Mlp> {
        if sizes.len() < 2 {
            return Err(Error::InvalidConfig {
                what: "Mlp",
                reason: format!("needs at least [in, out] sizes, got {sizes:?}"),
            });
        }
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(tape, w[0], w[1], dtype, device, seed.wrapping_add(i as u64)))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }

    /// An MLP from layers whose widths chain (`layers[i].out_features() == layers[i + 1].in_features()`)
    /// and that share one dtype and one device (a forward pass could not mix them).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// let again = Mlp::from_layers(mlp.layers().to_vec(), Activation::Relu)?;
    /// assert_eq!(again.sizes(), [2, 8, 3]);
    /// # Ok(()) }
    /// ```
    pub fn from_layers(layers: Vec<Linear>, activation: Activation) -> Result<Mlp> {
        if layers.is_empty() {
            return Err(Error::InvalidConfig { what: "Mlp", reason: "needs at least one layer".into() });
        }
        let (dtype, device) = (layers[0].weight.value().dtype(), layers[0].weight.value().device());
        for (i, layer) in layers.iter().enumerate() {
            let (d, dev) = (layer.weight.value().dtype(), layer.weight.value().device());
            if d != dtype || dev != device {
                return Err(Error::InvalidConfig {
                    what: "Mlp",
                    reason: format!(
                        "layer {i} is {d} on {dev} but layer 0 is {dtype} on {device}; all layers must agree"
                    ),
                });
            }
        }
        for (i, pair) in layers.windows(2).enumerate() {
            if pair[0].out_features() != pair[1].in_features() {
                return Err(Error::InvalidConfig {
                    what: "Mlp",
                    reason: format!(
                        "layer {i} has {} outputs but layer {} takes {} inputs",
                        pair[0].out_features(),
                        i + 1,
                        pair[1].in_features()
                    ),
                });
            }
        }
        Ok(Mlp { layers, activation })
    }

    /// The logits for `x` of shape `[batch, in]`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// let x = opsmith_autograd::Var::constant(opsmith_host::Tensor::from_vec(vec![0.5f32, -1.0], [1, 2], Device::Cpu)?);
    /// assert_eq!(mlp.forward(&x)?.value().dims(), [1, 3]);
    /// # Ok(()) }
    /// ```
    pub fn forward(&self, x: &Var) -> Result<Var> {
        let (last, hidden) =
            self.layers.split_last().ok_or(crate::Error::Host(opsmith_host::Error::InvalidArgument {
                op: "Mlp::forward",
                reason: "the MLP has no layers".into(),
            }))?;
        // With ReLU, the last hidden layer and the output layer are one op (on CUDA, for narrow
        // inputs and outputs, one launch each way).
        let (hidden, fused_pair) = match (self.activation, hidden.split_last()) {
            (Activation::Relu, Some((before_last, rest))) => (rest, Some(before_last)),
            _ => (hidden, None),
        };
        let mut h = x.clone();
        for layer in hidden {
            h = match self.activation {
                // A ReLU after a layer fuses into it.
                Activation::Relu => layer.forward_relu(&h)?,
                other => other.apply(&layer.forward(&h)?)?,
            };
        }
        match fused_pair {
            Some(first) => crate::ops::linear_relu_linear(&h, first.weight(), first.bias(), last.weight(), last.bias()),
            None => last.forward(&h),
        }
    }

    /// Every parameter, layer by layer (weight, then bias): what an optimizer updates.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.parameters().len(), 4);
    /// # Ok(()) }
    /// ```
    pub fn parameters(&self) -> Vec<Var> {
        self.layers.iter().flat_map(|l| [l.weight.clone(), l.bias.clone()]).collect()
    }

    /// Every parameter with its name in safetensors files (`layers.0.weight`, `layers.0.bias`,
    /// …), in the order of [`Mlp::parameters`]: for logs, checkpoints and exported models.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// let names: Vec<String> = mlp.named_parameters().into_iter().map(|(name, _)| name).collect();
    /// assert_eq!(names, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
    /// # Ok(()) }
    /// ```
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                [(format!("layers.{i}.weight"), l.weight.clone()), (format!("layers.{i}.bias"), l.bias.clone())]
            })
            .collect()
    }

    /// The layers.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.layers().len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }

    /// The activation between layers.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.activation(), Activation::Relu);
    /// # Ok(()) }
    /// ```
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// The layer widths, `[in, hidden…, out]`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.sizes(), [2, 8, 3]);
    /// # Ok(()) }
    /// ```
    pub fn sizes(&self) -> Vec<usize> {
        std::iter::once(self.layers[0].in_features()).chain(self.layers.iter().map(Linear::out_features)).collect()
    }

    /// The device of the parameters.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert_eq!(mlp.device(), Device::Cpu);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.layers[0].weight.value().device()
    }

    /// The weights as a safetensors file: `layers.{i}.weight` (`[in, out]`) and
    /// `layers.{i}.bias`, in the parameters' dtype, with the activation in the metadata.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 2], Activation::Silu, DType::F32, Device::Cpu, 3)?;
    /// let bytes = mlp.to_safetensors()?;
    /// let back = Mlp::from_safetensors(&bytes, Device::Cpu, None)?;
    /// assert_eq!(back.activation(), Activation::Silu);
    /// assert_eq!(back.layers()[0].weight().value().to_vec::<f32>()?, mlp.layers()[0].weight().value().to_vec::<f32>()?);
    /// # Ok(()) }
    /// ```
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        let mut tensors = Vec::new();
        for (name, var) in self.named_parameters() {
            let t = var.value();
            tensors.push((name, t.dtype(), t.dims().to_vec(), tensor_bytes(t)?));
        }
        let views = tensors
            .iter()
            .map(|(name, dtype, dims, bytes)| {
                let view = safetensors::tensor::TensorView::new(st_dtype(*dtype), dims.clone(), bytes)
                    .map_err(|e| Error::ModelFile { path: name.clone(), reason: e.to_string() })?;
                Ok((name.clone(), view))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = HashMap::from([
            (FORMAT_KEY.0.to_string(), FORMAT_KEY.1.to_string()),
            ("activation".to_string(), self.activation.name().to_string()),
        ]);
        safetensors::serialize(views, Some(metadata))
            .map_err(|e| Error::ModelFile { path: "<memory>".into(), reason: e.to_string() })
    }

    /// Writes [`Mlp::to_safetensors`] to `path`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// let path = std::env::temp_dir().join(format!("opsmith-doc-{}.safetensors", std::process::id()));
    /// mlp.save_safetensors(&path)?;
    /// assert_eq!(Mlp::load_safetensors(&path, Device::Cpu, None)?.sizes(), [2, 8, 3]);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok(()) }
    /// ```
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_safetensors()?;
        std::fs::write(path, bytes)
            .map_err(|e| Error::ModelFile { path: path.display().to_string(), reason: e.to_string() })
    }

    /// Reads a file written by [`Mlp::save_safetensors`], onto `device`; parameters are tracked on
    /// `tape`, or constants (for inference) when it is `None`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Error, nn::Mlp};
    /// use opsmith_host::Device;
    /// let missing = Mlp::load_safetensors("no/such/file.safetensors", Device::Cpu, None);
    /// assert!(matches!(missing, Err(Error::ModelFile { .. })));
    /// # Ok(()) }
    /// ```
    pub fn load_safetensors(path: impl AsRef<Path>, device: Device, tape: Option<&Tape>) -> Result<Mlp> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::ModelFile { path: path.display().to_string(), reason: e.to_string() })?;
        Mlp::from_safetensors(&bytes, device, tape).map_err(|e| match e {
            Error::ModelFile { reason, .. } => Error::ModelFile { path: path.display().to_string(), reason },
            Error::InvalidModel { tensor, reason, .. } => {
                Error::InvalidModel { path: path.display().to_string(), tensor, reason }
            }
            other => other,
        })
    }

    /// Parses the bytes of a file written by [`Mlp::to_safetensors`].
    ///
    /// The file is checked whole before anything is loaded, strictly (as PyTorch's
    /// `load_state_dict(strict=True)`): it must hold exactly `layers.0.weight`, `layers.0.bias`,
    /// ... `layers.{n-1}.bias`, with no gap in the numbering and no other tensor; every tensor in
    /// one dtype that `device` can run (CUDA has no f64 matmul); each weight `[in, out]` with
    /// `in, out > 0` and its bias `[out]`; widths that chain from layer to layer; and only finite
    /// values. Anything else is [`Error::InvalidModel`] naming the tensor, so a bad file fails
    /// here rather than on every forward pass.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith_host::{DType, Device};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 0)?;
    /// assert!(Mlp::from_safetensors(b"not a model", Device::Cpu, None).is_err());
    /// assert_eq!(Mlp::from_safetensors(&mlp.to_safetensors()?, Device::Cpu, None)?.sizes(), [2, 8, 3]);
    /// # Ok(()) }
    /// ```
    pub fn from_safetensors(bytes: &[u8], device: Device, tape: Option<&Tape>) -> Result<Mlp> {
        let bad = |reason: String| Error::ModelFile { path: "<memory>".into(), reason };
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        if metadata.get(FORMAT_KEY.0).map(String::as_str) != Some(FORMAT_KEY.1) {
            return Err(bad(format!("not an opsmith MLP file (metadata {FORMAT_KEY:?} missing)")));
        }
        let activation = metadata
            .get("activation")
            .and_then(|a| Activation::from_name(a))
            .ok_or_else(|| bad(format!("unknown activation {:?}", metadata.get("activation"))))?;
        let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let layers = check_layers(&file, device)?;
        let mut linears = Vec::with_capacity(layers.len());
        for [(weight_name, weight), (bias_name, bias)] in &layers {
            let weight = load_tensor(weight_name, weight, device)?;
            let bias = load_tensor(bias_name, bias, device)?;
            linears.push(Linear::from_tensors(weight, bias, tape)?);
        }
        Mlp::from_layers(linears, activation)
    }
}

/// An [`Error::InvalidModel`] for bytes in memory ([`Mlp::load_safetensors`] fills in the path).
fn invalid_model(tensor: &str, reason: String) -> Error {
    Error::InvalidModel { path: "<memory>".into(), tensor: tensor.into(), reason }
}

/// The layer index of `layers.{i}.weight` or `layers.{i}.bias`, with `i` in plain decimal
/// (`layers.01.weight` is not layer 1); `None` for any other name.
fn parse_layer_name(name: &str) -> Option<usize> {
    let (index, part) = name.strip_prefix("layers.")?.split_once('.')?;
    let i: usize = index.parse().ok()?;
    (matches!(part, "weight" | "bias") && i.to_string() == index).then_some(i)
}

type NamedView<'a> = (String, safetensors::tensor::TensorView<'a>);

/// Checks the file's header: names, numbering, dtypes, device support and shapes; returns each
/// layer's weight and bias, in order. Nothing is read or allocated per element here.
fn check_layers<'a>(file: &safetensors::SafeTensors<'a>, device: Device) -> Result<Vec<[NamedView<'a>; 2]>> {
    let mut names = file.names();
    names.sort_unstable();
    let mut indices = std::collections::BTreeSet::new();
    for name in &names {
        let Some(i) = parse_layer_name(name) else {
            return Err(invalid_model(
                name,
                "unexpected tensor: an MLP file holds only layers.{i}.weight and layers.{i}.bias".into(),
            ));
        };
        indices.insert(i);
    }
    let Some(&last) = indices.last() else {
        return Err(invalid_model("layers.0.weight", "missing: the file holds no tensors".into()));
    };
    // Each of 0..indices.len() present means the indices are exactly 0..n; any larger index
    // leaves one of them missing, and that one is reported (bounded by the tensors in the file).
    let mut layers = Vec::with_capacity(indices.len());
    let mut first_dtype = None;
    let mut previous_out = None;
    for i in 0..indices.len() {
        let view = |part: &str| {
            let name = format!("layers.{i}.{part}");
            match file.tensor(&name) {
                Ok(view) => Ok((name, view)),
                Err(_) if !indices.contains(&i) => {
                    let reason =
                        format!("missing, but layers.{last} exists: layers must be numbered 0, 1, 2, ... without gaps");
                    Err(invalid_model(&name, reason))
                }
                Err(_) => Err(invalid_model(&name, format!("missing: layer {i} needs a weight and a bias"))),
            }
        };
        let (weight, bias) = (view("weight")?, view("bias")?);
        for (name, view) in [&weight, &bias] {
            let dtype = host_dtype(view.dtype()).ok_or_else(|| {
                invalid_model(name, format!("unsupported dtype {:?}; expected F64, F32, F16 or BF16", view.dtype()))
            })?;
            let (first_name, first) = first_dtype.get_or_insert_with(|| (name.clone(), dtype));
            if dtype != *first {
                return Err(invalid_model(
                    name,
                    format!("dtype {dtype} differs from {first_name}'s {first}; all tensors must share one dtype"),
                ));
            }
            if dtype == DType::F64 && device.is_cuda() {
                return Err(invalid_model(
                    name,
                    format!(
                        "f64 weights cannot run on {device}: CUDA has no f64 matmul; convert the model to f32 or load it on the CPU"
                    ),
                ));
            }
        }
        let &[inputs, outputs] = weight.1.shape() else {
            return Err(invalid_model(&weight.0, format!("shape {:?} is not [in, out]", weight.1.shape())));
        };
        if inputs == 0 || outputs == 0 {
            return Err(invalid_model(
                &weight.0,
                format!("shape [{inputs}, {outputs}]: a layer needs at least one input and one output"),
            ));
        }
        if bias.1.shape() != [outputs] {
            return Err(invalid_model(
                &bias.0,
                format!(
                    "shape {:?} does not match {}'s [{inputs}, {outputs}]; expected [{outputs}]",
                    bias.1.shape(),
                    weight.0
                ),
            ));
        }
        if let Some(previous) = previous_out.filter(|&p| p != inputs) {
            return Err(invalid_model(
                &weight.0,
                format!("takes {inputs} inputs but layer {} gives {previous} outputs", i - 1),
            ));
        }
        previous_out = Some(outputs);
        layers.push([weight, bias]);
    }
    Ok(layers)
}

fn host_dtype(dtype: safetensors::Dtype) -> Option<DType> {
    match dtype {
        safetensors::Dtype::F64 => Some(DType::F64),
        safetensors::Dtype::F32 => Some(DType::F32),
        safetensors::Dtype::F16 => Some(DType::F16),
        safetensors::Dtype::BF16 => Some(DType::BF16),
        safetensors::Dtype::U32 => Some(DType::U32),
        safetensors::Dtype::I64 => Some(DType::I64),
        _ => None,
    }
}

fn st_dtype(dtype: DType) -> safetensors::Dtype {
    match dtype {
        DType::F64 => safetensors::Dtype::F64,
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::U32 => safetensors::Dtype::U32,
        DType::I64 => safetensors::Dtype::I64,
    }
}

/// The little-endian bytes of a tensor's values, as safetensors stores them.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F64 => t.to_vec::<f64>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => t.to_vec::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => t.to_vec::<half::f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => t.to_vec::<half::bf16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U32 => t.to_vec::<u32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I64 => t.to_vec::<i64>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

/// The tensor's values onto `device`, refusing any that is not finite (a NaN weight would make
/// every answer NaN).
fn load_tensor(name: &str, view: &safetensors::tensor::TensorView<'_>, device: Device) -> Result<Tensor> {
    fn finite<T: Copy + std::fmt::Debug>(name: &str, values: Vec<T>, is_finite: impl Fn(T) -> bool) -> Result<Vec<T>> {
        match values.iter().position(|&v| !is_finite(v)) {
            Some(i) => Err(invalid_model(name, format!("element {i} is {:?}; weights must be finite", values[i]))),
            None => Ok(values),
        }
    }
    let bytes = view.data();
    let shape = view.shape().to_vec();
    let t = match view.dtype() {
        safetensors::Dtype::F64 => {
            let values = bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            Tensor::from_vec(finite(name, values, f64::is_finite)?, shape, device)
        }
        safetensors::Dtype::F32 => {
            let values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            Tensor::from_vec(finite(name, values, f32::is_finite)?, shape, device)
        }
        safetensors::Dtype::F16 => {
            let values =
                bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            Tensor::from_vec(finite(name, values, half::f16::is_finite)?, shape, device)
        }
        safetensors::Dtype::BF16 => {
            let values =
                bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            Tensor::from_vec(finite(name, values, half::bf16::is_finite)?, shape, device)
        }
        other => return Err(invalid_model(name, format!("unsupported dtype {other:?}"))),
    };
    Ok(t?)
}
