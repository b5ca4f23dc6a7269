//! The shape ops against references written here with index arithmetic in f64: each op is a
//! gather (every output element is one input element), so its value is that gather and its
//! gradient the matching scatter-add of the output's gradient. Also the uniform-gradient path,
//! the dtype of `to_dtype`'s gradient, and the argument errors.
mod common;

use common::{ravel, tensor, unravel, values};
use opsmith_autograd::{Error, Result, Tape, Var, ops};
use opsmith_host::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;

/// Where each output element comes from: (input, flat index in that input).
type Gather = Vec<(usize, usize)>;

/// Values of the output, from the inputs' values.
fn gather(map: &Gather, inputs: &[Vec<f64>]) -> Vec<f64> {
    map.iter().map(|&(k, i)| inputs[k][i]).collect()
}

/// The inputs' gradients: each output gradient added to the element it came from.
fn scatter(map: &Gather, g: &[f64], sizes: &[usize]) -> Vec<Vec<f64>> {
    let mut out: Vec<Vec<f64>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    for (&(k, i), &gv) in map.iter().zip(g) {
        out[k][i] += gv;
    }
    out
}

fn narrow_map(dims: &[usize], dim: usize, start: usize, len: usize) -> (Vec<usize>, Gather) {
    let mut out = dims.to_vec();
    out[dim] = len;
    let n: usize = out.iter().product();
    let map = (0..n)
        .map(|f| {
            let mut index = unravel(f, &out);
            index[dim] += start;
            (0, ravel(&index, dims))
        })
        .collect();
    (out, map)
}

fn permute_map(dims: &[usize], order: &[usize]) -> (Vec<usize>, Gather) {
    let out: Vec<usize> = order.iter().map(|&d| dims[d]).collect();
    let n: usize = out.iter().product();
    let map = (0..n)
        .map(|f| {
            let index = unravel(f, &out);
            let mut source = vec![0; dims.len()];
            for (k, &d) in order.iter().enumerate() {
                source[d] = index[k];
            }
            (0, ravel(&source, dims))
        })
        .collect();
    (out, map)
}

fn cat_map(shapes: &[&[usize]], dim: usize) -> (Vec<usize>, Gather) {
    let mut out = shapes[0].to_vec();
    out[dim] = shapes.iter().map(|s| s[dim]).sum();
    let n: usize = out.iter().product();
    let map = (0..n)
        .map(|f| {
            let mut index = unravel(f, &out);
            let mut k = 0;
            while index[dim] >= shapes[k][dim] {
                index[dim] -= shapes[k][dim];
                k += 1;
            }
            (k, ravel(&index, shapes[k]))
        })
        .collect();
    (out, map)
}

fn stack_map(shape: &[usize], count: usize, dim: usize) -> (Vec<usize>, Gather) {
    let mut out = shape.to_vec();
    out.insert(dim, count);
    let n: usize = out.iter().product();
    let map = (0..n)
        .map(|f| {
            let mut index = unravel(f, &out);
            let k = index.remove(dim);
            (k, ravel(&index, shape))
        })
        .collect();
    (out, map)
}

/// Same elements in the same order: squeeze, unsqueeze, reshape.
fn identity_map(n: usize) -> Gather {
    (0..n).map(|i| (0, i)).collect()
}

/// The op under test, on the case's inputs.
type Op = Box<dyn Fn(&[Var]) -> Result<Var>>;

struct Case {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    out_dims: Vec<usize>,
    map: Gather,
    f: Op,
}

fn cases() -> Vec<Case> {
    let case = |name, shapes: &[&[usize]], (out_dims, map): (Vec<usize>, Gather), f: Op| Case {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        out_dims,
        map,
        f,
    };
    vec![
        case("narrow inner", &[&[3, 5]], narrow_map(&[3, 5], 1, 1, 3), Box::new(|v| ops::narrow(&v[0], 1, 1, 3))),
        case("narrow rows", &[&[5, 2]], narrow_map(&[5, 2], 0, 2, 2), Box::new(|v| v[0].narrow(0, 2, 2))),
        case("narrow middle dim", &[&[2, 4, 3]], narrow_map(&[2, 4, 3], 1, 3, 1), Box::new(|v| v[0].narrow(1, 3, 1))),
        case("narrow nothing", &[&[2, 3]], narrow_map(&[2, 3], 1, 2, 0), Box::new(|v| v[0].narrow(1, 2, 0))),
        case("narrow all", &[&[2, 3]], narrow_map(&[2, 3], 0, 0, 2), Box::new(|v| v[0].narrow(0, 0, 2))),
        case(
            "permute",
            &[&[2, 3, 4]],
            permute_map(&[2, 3, 4], &[2, 0, 1]),
            Box::new(|v| ops::permute(&v[0], &[2, 0, 1])),
        ),
        case(
            "permute rank 4",
            &[&[2, 1, 3, 2]],
            permute_map(&[2, 1, 3, 2], &[3, 1, 0, 2]),
            Box::new(|v| v[0].permute(&[3, 1, 0, 2])),
        ),
        case("transpose", &[&[3, 4]], permute_map(&[3, 4], &[1, 0]), Box::new(|v| ops::transpose(&v[0], 0, 1))),
        case(
            "transpose outer dims",
            &[&[2, 3, 4]],
            permute_map(&[2, 3, 4], &[2, 1, 0]),
            Box::new(|v| v[0].transpose(2, 0)),
        ),
        case(
            "cat",
            &[&[2, 3], &[2, 1], &[2, 2]],
            cat_map(&[&[2, 3], &[2, 1], &[2, 2]], 1),
            Box::new(|v| ops::cat(&[&v[0], &v[1], &v[2]], 1)),
        ),
        case(
            "cat rows",
            &[&[1, 3], &[2, 3]],
            cat_map(&[&[1, 3], &[2, 3]], 0),
            Box::new(|v| Var::cat(&[&v[0], &v[1]], 0)),
        ),
        case("cat one", &[&[2, 2]], cat_map(&[&[2, 2]], 1), Box::new(|v| Var::cat(&[&v[0]], 1))),
        case(
            "stack",
            &[&[2, 3], &[2, 3], &[2, 3]],
            stack_map(&[2, 3], 3, 1),
            Box::new(|v| ops::stack(&[&v[0], &v[1], &v[2]], 1)),
        ),
        case("stack at the end", &[&[4], &[4]], stack_map(&[4], 2, 1), Box::new(|v| Var::stack(&[&v[0], &v[1]], 1))),
        case("stack one", &[&[3]], stack_map(&[3], 1, 0), Box::new(|v| Var::stack(&[&v[0]], 0))),
        case("squeeze", &[&[3, 1, 2]], (vec![3, 2], identity_map(6)), Box::new(|v| ops::squeeze(&v[0], 1))),
        case("unsqueeze", &[&[3, 2]], (vec![3, 2, 1], identity_map(6)), Box::new(|v| ops::unsqueeze(&v[0], 2))),
        case("reshape", &[&[2, 6]], (vec![3, 1, 4], identity_map(12)), Box::new(|v| ops::reshape(&v[0], [3, 1, 4]))),
        case("reshape to a scalar", &[&[1, 1]], (vec![], identity_map(1)), Box::new(|v| v[0].reshape([]))),
        case("to_dtype", &[&[5]], (vec![5], identity_map(5)), Box::new(|v| ops::to_dtype(&v[0], DType::F64))),
    ]
}

/// Every op's value and gradient (from a nonzero, non-uniform output gradient) against its
/// gather and scatter-add, exactly: in f64 the ops only move elements, and the scatter-adds
/// add at most one term per element.
#[test]
fn values_and_gradients_match_the_index_references() -> Result<()> {
    for (seed, c) in cases().into_iter().enumerate() {
        let tape = Tape::new();
        let xs: Vec<Vec<f64>> = c
            .shapes
            .iter()
            .enumerate()
            .map(|(k, s)| values(s.iter().product(), 40 + 10 * seed as u64 + k as u64))
            .collect();
        let vars: Vec<Var> = xs
            .iter()
            .zip(&c.shapes)
            .map(|(x, s)| Ok(tape.var(tensor(x, s, DType::F64, CPU)?)))
            .collect::<Result<_>>()?;
        let y = (c.f)(&vars)?;
        assert_eq!(y.value().dims(), c.out_dims, "{}: dims", c.name);
        assert_eq!(y.value().to_vec_f64()?, gather(&c.map, &xs), "{}: values", c.name);
        let g = values(c.map.len(), 900 + seed as u64);
        let grads = tape.backward_with(&y, tensor(&g, &c.out_dims, DType::F64, CPU)?)?;
        let sizes: Vec<usize> = xs.iter().map(Vec::len).collect();
        for (k, (v, want)) in vars.iter().zip(scatter(&c.map, &g, &sizes)).enumerate() {
            let gx = grads.get(v).unwrap_or_else(|| panic!("{}: input {k} got no gradient", c.name));
            assert_eq!(gx.dims(), c.shapes[k], "{}: gradient {k} dims", c.name);
            assert_eq!(gx.dtype(), DType::F64);
            assert_eq!(gx.to_vec_f64()?, want, "{}: gradient {k}", c.name);
        }
        assert!(tape.is_empty(), "{}: backward consumed the node", c.name);
    }
    Ok(())
}

/// The same ops under `sum`: the seed of 1 reaches them as a uniform gradient (kept as one
/// value through all but `narrow`), and each input's gradient counts how often each of its
/// elements reaches the output.
#[test]
fn uniform_gradients_count_the_uses_of_each_element() -> Result<()> {
    for (seed, c) in cases().into_iter().enumerate() {
        let tape = Tape::new();
        let vars: Vec<Var> = c
            .shapes
            .iter()
            .enumerate()
            .map(|(k, s)| {
                Ok(tape.var(tensor(&values(s.iter().product(), seed as u64 + 7 * k as u64), s, DType::F64, CPU)?))
            })
            .collect::<Result<_>>()?;
        let loss = ops::sum(&(c.f)(&vars)?)?;
        let grads = tape.backward(&loss)?;
        let sizes: Vec<usize> = vars.iter().map(|v| v.value().elem_count()).collect();
        let counts = scatter(&c.map, &vec![1.0; c.map.len()], &sizes);
        for (k, (v, want)) in vars.iter().zip(counts).enumerate() {
            assert_eq!(grads.get(v).unwrap().to_vec_f64()?, want, "{}: gradient {k}", c.name);
        }
    }
    Ok(())
}

/// Worked by hand: `y = stack([x[:, 1:3]ᵀ, w], 0)`, `loss = Σ y ⊙ c`.
#[test]
fn a_chain_of_shape_ops_worked_by_hand() -> Result<()> {
    let tape = Tape::new();
    // x = [[1, 2, 3], [4, 5, 6]]; x[:, 1:3]ᵀ = [[2, 5], [3, 6]].
    let x = tape.var(tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64, CPU)?);
    let w = tape.var(tensor(&[-1.0, 0.5, 2.0, -3.0], &[2, 2], DType::F64, CPU)?);
    let y = Var::stack(&[&x.narrow(1, 1, 2)?.transpose(0, 1)?, &w], 0)?;
    assert_eq!(y.value().dims(), [2, 2, 2]);
    assert_eq!(y.value().to_vec_f64()?, [2.0, 5.0, 3.0, 6.0, -1.0, 0.5, 2.0, -3.0]);
    let c = Var::constant(tensor(&[0.5, 1.5, -2.0, 4.0, 3.0, -1.0, 0.25, 8.0], &[2, 2, 2], DType::F64, CPU)?);
    let grads = tape.backward(&ops::sum(&ops::mul(&y, &c)?)?)?;
    // dL/d(x[:, 1:3]ᵀ) = [[0.5, 1.5], [-2, 4]], so dL/dx[:, 1:3] = [[0.5, -2], [1.5, 4]].
    assert_eq!(grads.get(&x).unwrap().to_vec_f64()?, [0.0, 0.5, -2.0, 0.0, 1.5, 4.0]);
    assert_eq!(grads.get(&w).unwrap().to_vec_f64()?, [3.0, -1.0, 0.25, 8.0]);
    Ok(())
}

/// `to_dtype`'s gradient comes back in the input's dtype, through a tensor gradient and a
/// uniform one alike.
#[test]
fn to_dtype_gradients_have_the_input_dtype() -> Result<()> {
    let xs = [1.5, -0.25, 3.0];
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let tape = Tape::new();
        let x = tape.var(tensor(&xs, &[3], dtype, CPU)?);
        let y = x.to_dtype(DType::F64)?;
        assert_eq!(y.value().dtype(), DType::F64);
        assert_eq!(y.value().to_vec_f64()?, xs);
        let squares = tape.backward(&ops::sum(&ops::mul(&y, &y)?)?)?; // a tensor gradient: 2x
        let gx = squares.get(&x).unwrap();
        assert_eq!(gx.dtype(), dtype);
        assert_eq!(gx.to_vec_f64()?, xs.map(|x| 2.0 * x));
        let y = ops::to_dtype(&x, DType::F32)?;
        let mean = tape.backward(&ops::mean(&y)?)?; // a uniform gradient: 1/3
        let gx = mean.get(&x).unwrap();
        assert_eq!(gx.dtype(), dtype);
        let third = Tensor::full(1.0 / 3.0, [3], dtype, CPU)?.to_vec_f64()?;
        assert_eq!(gx.to_vec_f64()?, third);
    }
    Ok(())
}

/// `reshape`, `squeeze` and `unsqueeze` return views, and their gradients are views of the
/// output's gradient; still, no variable is handed memory that the caller or another
/// variable holds.
#[test]
fn views_and_their_gradients_share_no_memory_with_the_caller() -> Result<()> {
    let tape = Tape::new();
    let x = tape.var(tensor(&values(6, 3), &[2, 3], DType::F64, CPU)?);
    let y = x.reshape([3, 2])?.unsqueeze(0)?.squeeze(0)?;
    assert!(y.value().shares_storage(x.value()), "a view of x");
    let seed = tensor(&values(6, 4), &[3, 2], DType::F64, CPU)?;
    let grads = tape.backward_with(&y, seed.clone())?;
    let gx = grads.get(&x).unwrap();
    assert!(!gx.shares_storage(&seed), "the caller's seed is copied, not handed out");
    assert_eq!(gx.dims(), [2, 3]);
    assert_eq!(gx.to_vec_f64()?, seed.to_vec_f64()?);
    Ok(())
}

/// Without a tape (or under `no_grad`) the ops return constants and record nothing.
#[test]
fn constants_and_no_grad_record_nothing() -> Result<()> {
    let tape = Tape::new();
    let x = tape.var(tensor(&values(6, 5), &[2, 3], DType::F32, CPU)?);
    let c = Var::constant(x.value().clone());
    let y = Var::cat(&[&c.transpose(0, 1)?, &c.transpose(0, 1)?], 1)?;
    assert!(!y.requires_grad());
    {
        let _off = opsmith_autograd::no_grad();
        assert!(!x.narrow(1, 0, 2)?.requires_grad());
        assert!(!Var::stack(&[&x, &x], 0)?.requires_grad());
    }
    assert!(tape.is_empty());
    // A constant joined with a variable: only the variable gets a gradient.
    let z = Var::cat(&[&c, &x], 0)?;
    let grads = tape.backward(&ops::sum(&z)?)?;
    assert!(grads.get(&c).is_none());
    assert_eq!(grads.get(&x).unwrap().to_vec_f64()?, [1.0; 6]);
    Ok(())
}

/// The argument error of `result`, a host error inside [`Error::Host`].
fn host_error(result: Result<Var>) -> opsmith_host::Error {
    match result {
        Err(Error::Host(e)) => e,
        Err(other) => panic!("expected a host error, got {other}"),
        Ok(v) => panic!("expected an error, got a value of shape {:?}", v.value().dims()),
    }
}

fn invalid(result: Result<Var>, op: &str, mentions: &[&str]) {
    match host_error(result) {
        e @ opsmith_host::Error::InvalidArgument { .. } => {
            let message = e.to_string();
            assert!(matches!(e, opsmith_host::Error::InvalidArgument { op: o, .. } if o == op), "{message}");
            for m in mentions {
                assert!(message.contains(m), "{message} lacks {m}");
            }
        }
        other => panic!("expected InvalidArgument from {op}, got {other}"),
    }
}

/// Bad dims, ranges and shapes are typed errors naming the op called (not the host method
/// behind it) and the dim and shape, with nothing recorded and the inputs unchanged.
#[test]
fn bad_arguments_are_typed_errors_naming_the_op() -> Result<()> {
    use opsmith_host::Error as H;
    let tape = Tape::new();
    let xs = values(6, 8);
    let x = tape.var(tensor(&xs, &[2, 3], DType::F32, CPU)?);
    let row = tape.var(tensor(&values(3, 9), &[1, 3], DType::F32, CPU)?);

    invalid(x.narrow(2, 0, 1), "narrow", &["dim 2", "[2, 3]"]);
    invalid(ops::narrow(&x, 1, 2, 2), "narrow", &["dim 1", "[2, 3]"]); // 2..4 of 3
    invalid(x.narrow(1, usize::MAX, 2), "narrow", &["[2, 3]"]); // start + len overflows
    invalid(x.permute(&[0, 0]), "permute", &["[0, 0]", "[2, 3]"]);
    invalid(ops::permute(&x, &[1, 0, 2]), "permute", &["[1, 0, 2]"]);
    invalid(x.transpose(0, 2), "transpose", &["dim 2", "[2, 3]"]);
    invalid(x.squeeze(0), "squeeze", &["dim 0", "[2, 3]"]); // size 2
    invalid(ops::squeeze(&x, 5), "squeeze", &["dim 5"]);
    invalid(x.unsqueeze(3), "unsqueeze", &["dim 3", "[2, 3]"]);
    invalid(Var::stack(&[&x, &x], 3), "stack", &["dim 3", "[2, 3]"]);
    invalid(Var::cat(&[&x, &row], 2), "cat", &["dim 2"]);
    invalid(ops::cat(&[], 0), "cat", &[]);
    invalid(ops::stack(&[], 0), "stack", &[]);
    assert!(matches!(
        host_error(Var::cat(&[&x, &row], 1)),
        H::ShapeMismatch { op: "cat", lhs, rhs } if lhs == [2, 3] && rhs == [1, 3]
    ));
    assert!(matches!(host_error(ops::stack(&[&x, &row], 0)), H::ShapeMismatch { op: "stack", .. }));
    let half = tape.var(tensor(&values(3, 10), &[1, 3], DType::F16, CPU)?);
    assert!(matches!(
        host_error(Var::cat(&[&row, &half], 0)),
        H::DTypeMismatch { op: "cat", lhs: DType::F32, rhs: DType::F16 }
    ));
    assert!(matches!(host_error(x.reshape([4, 2])), H::ElementCount { op: "reshape", expected: 8, actual: 6, .. }));
    // Ranks past the host's limit of 6.
    let deep = tape.var(Tensor::zeros([1; 7], DType::F32, CPU)?);
    invalid(deep.transpose(0, 1), "transpose", &["rank 7"]);

    assert!(tape.is_empty(), "nothing recorded");
    assert_eq!(x.value().to_vec_f64()?, xs);
    Ok(())
}
