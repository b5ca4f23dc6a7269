//! The dataset the training examples share: two interleaved spirals, and the accuracy of
//! logits against labels.
#![allow(dead_code)]
use opsmith::Tensor;
use opsmith::autograd::Result;

/// Two interleaved spirals of `points` points in total, labels 0 and 1, with a little noise:
/// `(x, y)` features in about [-1, 1]. The same `seed` gives the same points.
pub fn spirals(points: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut features = Vec::with_capacity(points * 2);
    let mut labels = Vec::with_capacity(points);
    for i in 0..points {
        let class = (i % 2) as u32;
        let t = unit(); // position along the arm: radius and angle grow together
        let angle = t * 3.0 * std::f64::consts::PI + class as f64 * std::f64::consts::PI;
        let radius = 0.1 + 0.9 * t;
        let noise = |u: f64| (u - 0.5) * 0.04;
        features.push((radius * angle.cos() + noise(unit())) as f32);
        features.push((radius * angle.sin() + noise(unit())) as f32);
        labels.push(class);
    }
    (features, labels)
}

/// The share of rows whose largest logit is at the label.
pub fn accuracy(logits: &Tensor, labels: &[u32]) -> Result<f64> {
    let values = logits.to_vec_f64()?;
    let classes = logits.dims()[1];
    let correct = values
        .chunks(classes)
        .zip(labels)
        .filter(|(row, label)| {
            let best = row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best });
            best == **label as usize
        })
        .count();
    Ok(correct as f64 / labels.len() as f64)
}
