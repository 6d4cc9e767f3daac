"""A small TensorFlow job under MultiWorkerMirroredStrategy, driven only by TF_CONFIG.

A custom training loop (strategy.run), so it works with whichever Keras the
environment has. Each worker writes $GPUPOOL_JOB_DIR/results/<task>.json with
the steps it ran and its final weights: in sync, every worker holds the same.
"""

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG; worker 0 is the chief
task = json.loads(os.environ["TF_CONFIG"])["task"]

with strategy.scope():
    # MEAN aggregation: each replica's update is all-reduced across the workers.
    w = tf.Variable(tf.zeros([8, 1]), aggregation=tf.VariableAggregation.MEAN)
    b = tf.Variable(tf.zeros([1]), aggregation=tf.VariableAggregation.MEAN)

x = np.random.RandomState(0).rand(1024, 8).astype("float32")
y = x.sum(axis=1, keepdims=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64).with_options(options)
iterator = iter(strategy.experimental_distribute_dataset(dataset))


@tf.function
def train_step(it):
    def replica_fn(batch):
        bx, by = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(bx, w) + b - by))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica_fn, args=(next(it),)), axis=None)


steps = 0
for _ in range(STEPS):
    loss = train_step(iterator)
    steps += 1
result = {
    "task": task,
    "steps": steps,
    "loss": float(loss),
    "replicas_in_sync": strategy.num_replicas_in_sync,
    "weights": [round(float(v), 6) for v in tf.reshape(w, [-1]).numpy()],
}
out = Path(os.environ.get("GPUPOOL_JOB_DIR", ".")) / "results"
out.mkdir(parents=True, exist_ok=True)
(out / f"{task['type']}-{task['index']}.json").write_text(json.dumps(result))
print(json.dumps(result), flush=True)
