"""AMQP: the firing publisher, its framed batch writer and the events consumer; the only
dispatcher code that imports aio-pika, aiormq or pamqp."""
